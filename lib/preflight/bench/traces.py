"""Record ``torch.profiler`` traces of training steps: the evidence a team's own job would give.

The traces chapter of a real job reads Kineto traces, one file (or more) per rank, as
``torch.profiler`` writes them. This module writes such traces of steps Preflight runs itself, the
reference model's (``preflight.harness.reference``) or a workload's (``preflight.core.workload``), so that the
reader is tested on a trace from a real device, made with a known step time::

    python -m preflight.bench.traces --out DIR [--workload examples/small_cnn.py:build] [--steps 3] [--quick]
    torchrun --nproc-per-node 2 -m preflight.bench.traces --out DIR        # one file per rank

What is recorded, as a team would record it (PyTorch's recipe "Profiling your PyTorch module"):

- a schedule ``wait=1, warmup=1, active=steps``: the first step (allocator and autotuning warm-up)
  is not in the trace; ``ProfilerStep#N`` marks each step (``prof.step()``);
- CPU and CUDA activities (CUDA where the device is a GPU), ``record_shapes=True`` (input shapes and
  dtypes of every op), ``with_stack=False`` (stacks double the file and say nothing the op names do);
- under ``torchrun`` the model is wrapped in ``DistributedDataParallel``: the trace holds its gradient
  all-reduces (NCCL kernels on GPUs, gloo calls on the CPU);
- the file ``<out>/<name>-rank<R>.pt.trace.json.gz``: gzip-compressed Chrome trace JSON, the name
  ``tensorboard_trace_handler`` also accepts. Under ``torch.distributed`` the trace holds Kineto's
  ``distributedInfo`` (rank, world size, backend).

Each run also writes a record (method ``traces``) naming the files, the steps, the device and the
mean step time of the traced steps, timed by wall clock outside the profiler's records, against which
a trace reader's step times can be checked.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

from preflight.core.device import default_device, launch_rank, on_device
from preflight.core.records import Method
from preflight.core.timing import StepTimer, synchronize
from preflight.harness.categories import profiler_log_filtered

METHOD = Method("traces", 1, required=("files", "steps", "device", "step_time_s"))


def trace_steps(step, device, out: Path, name: str, steps: int = 3, rank: int | None = None) -> dict:
    """Run ``step()`` (one training step) ``steps + 2`` times under ``torch.profiler`` with the schedule
    above; write ``<out>/<name>-rank<R>.pt.trace.json.gz``. Returns {file, steps, events, bytes,
    step_time_s, wall_s}. The traced steps run free, as a real job's do (no synchronisation between
    them, which would add idle time at every step boundary of the trace): ``step_time_s`` is their
    mean, one synchronisation before the first and one after the last."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    dev = torch.device(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    out.mkdir(parents=True, exist_ok=True)
    rank = 0 if rank is None else rank
    path = out / f"{name}-rank{rank}.pt.trace.json.gz"
    raw = out / f".{name}-rank{rank}.pt.trace.json"           # Kineto writes plain JSON; gzipped below
    t0 = time.perf_counter()
    with profiler_log_filtered(), profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=steps),
                                          record_shapes=True,
                                          on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        for i in range(steps + 2):
            if i == 2:                           # the traced steps start: time them from here
                synchronize(dev)
                active_t0 = time.perf_counter()
            step()
            if i == steps + 1:
                synchronize(dev)
                step_s = (time.perf_counter() - active_t0) / steps
            prof.step()
    wall = time.perf_counter() - t0
    data = raw.read_bytes()
    events = len(json.loads(data).get("traceEvents", []))
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    raw.unlink()
    return {"file": path.name, "steps": steps, "events": events, "bytes": path.stat().st_size,
            "step_time_s": step_s, "wall_s": wall}


def reference_step(device, quick: bool = False):
    """One training step of the reference model on ``device`` (the baseline's step), as a closure."""
    import torch

    from preflight.bench.baseline import _step, make_loader
    from preflight.harness import reference as ref

    dev = torch.device(device)
    cfg = ref.config_for(dev, tiny=quick)
    model = _ddp(ref.make_model(cfg, dev), dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = iter(make_loader(cfg, dev, 0))
    return (lambda: _step(model, opt, batches, cfg, dev, StepTimer(dev))), {"model": "reference", **cfg.as_dict()}


def _ddp(model, dev):
    """``model`` in DistributedDataParallel under a process group (its gradient all-reduces, the
    communication a trace reader looks for), else itself."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if not (dist.is_available() and dist.is_initialized()):
        return model
    return DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)


def workload_step(entry: str, device):
    """One training step of a workload (``file.py:build`` or ``package.module:build``) on ``device``."""
    import torch

    from preflight.core.workload import load, to_device

    dev = torch.device(device)
    wl = load(entry, Path.cwd())
    wl.model.to(dev).train()
    opt = wl.make_optimizer()
    module = _ddp(wl.model, dev)

    def step():
        inputs, targets = wl.batch()
        loss = wl.step_loss(to_device(inputs, dev), to_device(targets, dev), module)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, {"model": "workload", **wl.describe()}


def measure(out: Path, device=None, workload: str | None = None, steps: int = 3, quick: bool = False) -> dict:
    """Method ``traces``: trace ``steps`` training steps of the reference model (or ``workload``) on
    ``device`` (default: this rank's GPU, else the CPU) into ``out``; the results of the record."""
    import torch

    dev = torch.device(device) if device is not None else default_device()
    rank = launch_rank()
    with on_device(dev):
        step, what = workload_step(workload, dev) if workload else reference_step(dev, quick)
        name = "workload" if workload else "reference"
        got = trace_steps(step, dev, Path(out), name, steps, rank)
    return {"files": [got["file"]], "steps": steps, "device": str(dev), "rank": rank, "model": what,
            "step_time_s": got["step_time_s"], "events": got["events"],
            "bytes": got["bytes"], "wall_s": got["wall_s"],
            "backend": _backend()}


def _backend() -> str | None:
    import torch.distributed as dist

    return dist.get_backend() if dist.is_available() and dist.is_initialized() else None


def main(argv: list[str] | None = None) -> int:
    from preflight.core.records import save_record

    ap = argparse.ArgumentParser(prog="python -m preflight.bench.traces", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for the traces and the record")
    ap.add_argument("--workload", default=None, help="file.py:build or package.module:build (default: the reference model)")
    ap.add_argument("--steps", type=int, default=3, help="traced steps, 1-50 (default 3)")
    ap.add_argument("--device", default=None, help="e.g. cpu or cuda:1 (default: this rank's GPU, else CPU)")
    ap.add_argument("--quick", action="store_true", help="the tiny reference model (tests, smoke runs)")
    args = ap.parse_args(argv)
    if not 1 <= args.steps <= 50:
        print(f"traces: --steps {args.steps} is out of range: accepted 1 to 50", file=sys.stderr)
        return 2
    dist_init = os.environ.get("WORLD_SIZE", "1") != "1"
    if dist_init:      # under torchrun: a process group, so that the trace carries distributedInfo
        from preflight.harness.launch import init_distributed

        _, dev = init_distributed()          # NCCL on this rank's GPU, else gloo on the CPU
        args.device = args.device or str(dev)
    try:
        res = measure(args.out, args.device, args.workload, args.steps, args.quick)
    finally:
        if dist_init:
            import torch.distributed as dist

            dist.barrier()
            dist.destroy_process_group()
    rank = res["rank"]
    name = ("workload" if args.workload else "reference") + (f"-rank{rank}" if rank is not None else "")
    path = save_record(METHOD.record({"steps": args.steps, "workload": args.workload, "quick": args.quick}, res),
                       args.out, name=name)
    print(f"[{path.name}] {res['device']}: {res['files'][0]}, {res['steps']} steps, {res['events']} events, "
          f"{res['bytes'] / 1e6:.2f} MB, step {res['step_time_s'] * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
