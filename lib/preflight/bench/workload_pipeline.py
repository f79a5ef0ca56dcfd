"""Chapter 4 on your own model: its blocks timed, cut into pipeline stages, and run as a pipeline.

A workload's ``blocks`` (``preflight.core.workload``; default its top-level children) are its layers.
``block_times`` runs one forward of the whole model with a hook on each block that keeps the
block's input, then times each block alone, forward + backward of one micro-batch, on one thread (as
a pipeline rank runs on a CPU): real inputs, whatever the model does between blocks. From those
times ``preflight.models.pipeline`` cuts ``p`` stages two ways, by count and by time (the exact
optimal contiguous partition), and predicts the gain: the slowest stage sets the pace.

The prediction is then measured with ``torch.distributed.pipelining`` (GPipe, ``p`` ranks under
torchrun, ``m`` micro-batches of the workload's batch, its own loss) for both partitions, but only
where the blocks **run in sequence**: the model's output equals the blocks applied one after the
other to its single input tensor, and the blocks hold every parameter. Anything else (a residual
around blocks, two inputs, computation outside the blocks) cannot be cut into stages by slicing
the block list; ``in_sequence`` says why, and the chapter shows the prediction only.

    torchrun --nproc_per_node=2 -m preflight.bench.workload_pipeline --entry my_workload.py:build \\
        --base DIR --out DIR --partition 0,3 --microbatches 4       # one run (rank 0 writes the record)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from preflight.core.records import Method
from preflight.harness.launch import exit_worker

METHOD = Method("workload_partition", 1, required=("workload", "p", "blocks", "by_count", "by_time",
                                                   "predicted_gain", "in_sequence", "measured_gain"), runs_on="ranks")
WARMUP_STEPS = 2


def block_modules(wl) -> list:
    return [(name, wl.model.get_submodule(name)) for name in wl.blocks]


def _tensors(x) -> list:
    import torch

    return [t for t in (x if isinstance(x, (tuple, list)) else [x]) if isinstance(t, torch.Tensor)]


def in_sequence(wl, inputs) -> tuple[bool, str]:
    """Whether the blocks, applied in order, are the model (same output, every parameter), and why not."""
    import torch

    blocks = block_modules(wl)
    if isinstance(inputs, (tuple, list)):
        return False, f"the model takes {len(inputs)} inputs; a pipeline of sliced blocks passes one tensor"
    if len(blocks) < 2:
        return False, f"{len(blocks)} block: nothing to cut into stages"
    inside = {id(p) for _, m in blocks for p in m.parameters()}
    outside = [n for n, p in wl.model.named_parameters() if id(p) not in inside]
    if outside:
        return False, f"parameters outside the blocks ({', '.join(outside[:3])}): the blocks are not the whole model"
    wl.model.eval()
    try:
        with torch.no_grad():
            whole = wl.model(inputs)
            x = inputs
            for _, m in blocks:
                x = m(x)
        same = isinstance(whole, torch.Tensor) and isinstance(x, torch.Tensor) and whole.shape == x.shape \
            and torch.allclose(whole, x, rtol=1e-5, atol=1e-6)
    except Exception as err:  # noqa: BLE001 - a block that cannot take its predecessor's output
        return False, f"the blocks do not run in sequence: applying them in order raised {type(err).__name__}: {err}"
    finally:
        wl.model.train()
    if not same:
        return False, ("the blocks applied in order do not give the model's output (it computes something "
                       "between or around them, e.g. a residual connection)")
    return True, "the blocks applied in order give the model's output"


def block_times(wl, device="cpu", inputs=None, quick: bool = False) -> list[dict]:
    """Forward + backward seconds of each block alone on the input it gets inside the model:
    ``[{name, params, time_s}]``, the median after warm-up, one thread."""
    import torch

    from preflight.core.timing import time_fn
    from preflight.core.workload import to_device

    wl.model.to(device).train()
    if inputs is None:
        inputs = to_device(wl.batch()[0], device)
    captured, hooks = {}, []
    for name, m in block_modules(wl):
        hooks.append(m.register_forward_pre_hook(lambda mod, args, kwargs, n=name: captured.setdefault(n, (args, kwargs)),
                                                 with_kwargs=True))
    try:
        with torch.no_grad():
            wl.forward(inputs)
    finally:
        for h in hooks:
            h.remove()
    threads, rows = torch.get_num_threads(), []
    torch.set_num_threads(1)
    try:
        for name, m in block_modules(wl):
            if name not in captured:
                rows.append({"name": name, "params": sum(p.numel() for p in m.parameters()), "time_s": 0.0,
                             "note": "not called in the forward"})
                continue
            args, kwargs = captured[name]
            args = [a.detach().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a for a in args]

            def fwd_bwd(mod=m, a=args, kw=kwargs):
                outs = _tensors(mod(*a, **kw))
                torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
            t = time_fn(fwd_bwd, device=device, warmup=1 if quick else 2, repeats=3 if quick else 5, min_time_s=0.05)
            rows.append({"name": name, "params": sum(p.numel() for p in m.parameters()), "time_s": t.median_s})
            m.zero_grad(set_to_none=True)
    finally:
        torch.set_num_threads(threads)
    return rows


def _microbatches(samples: int) -> int:
    return next(m for m in (4, 2, 1) if samples % m == 0)


def worker(entry: str, base: str, out, partition: list[int], m: int, steps: int, name: str) -> dict | None:
    """One pipeline rank: its stage of the blocks (``partition``: first block of each stage), GPipe."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed import pipelining as pp

    from preflight.core.workload import load
    from preflight.harness.launch import init_distributed

    de, device = init_distributed()
    rank, p = de["rank"], de["world_size"]
    try:
        wl = load(entry, base)                           # seeded: every rank the same weights
        inputs, targets = wl.batch()
        blocks = [mod for _, mod in block_modules(wl)]
        bounds = [*partition, len(blocks)]
        mb = inputs.shape[0] // m
        with torch.no_grad():                            # the activation each stage receives, for its shape
            x, examples = inputs[:mb], []
            for s in range(p):
                examples.append(x)
                for mod in blocks[bounds[s]:bounds[s + 1]]:
                    x = mod(x)
        stage = pp.PipelineStage(nn.Sequential(*blocks[bounds[rank]:bounds[rank + 1]]).to(device), rank, p, device,
                                 input_args=examples[rank].to(device))
        sched = pp.ScheduleGPipe(stage, m, loss_fn=wl.loss)
        opt = wl.make_optimizer(stage.submod.parameters())
        inputs, targets = inputs.to(device), targets.to(device)
        times = []
        for k in range(WARMUP_STEPS + steps):
            opt.zero_grad(set_to_none=True)
            dist.barrier()
            t0 = time.perf_counter()
            sched.step(*([inputs] if rank == 0 else []), target=targets if rank == p - 1 else None)
            dist.barrier()
            if k >= WARMUP_STEPS:
                times.append(time.perf_counter() - t0)
            opt.step()
        step_s = statistics.median(times)
        record = None
        if rank == 0:
            res = {"workload": wl.describe(), "partition": partition, "p": p, "m": m, "step_s": step_s,
                   "throughput": inputs.shape[0] / step_s, "backend": dist.get_backend(), "device_kind": device.type}
            record = {"method": "workload_pipeline_run", "results": res}
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / f"{name}.json").write_text(json.dumps(record))
        dist.barrier()
        return record
    finally:
        dist.destroy_process_group()


def _run(wl, partition, m, p, quick, timeout=600.0) -> dict:
    from preflight.harness.launch import run_torchrun, torchrun_cmd

    with tempfile.TemporaryDirectory(prefix="preflight-wlpipe-") as tmp:
        cmd = torchrun_cmd(p, "preflight.bench.workload_pipeline", "--entry", wl.entry, "--base", wl.base_dir,
                           "--out", tmp, "--partition", ",".join(map(str, partition)), "--microbatches", str(m),
                           "--steps", str(3 if quick else 8), "--name", "run")
        run_torchrun(cmd, dict(os.environ, TMPDIR=tmp, OMP_NUM_THREADS="1"), timeout)
        return json.loads((Path(tmp) / "run.json").read_text())["results"]


def measure_partition(wl, p: int = 2, device="cpu", quick: bool = False) -> dict:
    """Method ``workload_partition``: block times, partitions by count and by time, the predicted gain,
    and (where the blocks run in sequence) both partitions measured through a real pipeline."""
    from preflight.core.workload import samples_in, to_device
    from preflight.models import pipeline as P

    inputs = to_device(wl.batch()[0], device)
    ok, why = in_sequence(wl, inputs)
    p = min(p, len(wl.blocks))
    m = _microbatches(samples_in(inputs))
    mb = inputs[: samples_in(inputs) // m] if not isinstance(inputs, (tuple, list)) else inputs
    rows = block_times(wl, device, mb, quick)
    times = [r["time_s"] for r in rows]
    out = {"workload": wl.describe(), "p": p, "m": m, "blocks": rows, "in_sequence": ok, "in_sequence_reason": why,
           "measured_gain": None, "throughput_count": None, "throughput_time": None}
    if p < 2 or sum(times) <= 0:
        return out | {"by_count": None, "by_time": None, "predicted_gain": None}
    by_count, by_time = P.partition_by_count(len(times), p), P.partition_by_time(times, p)
    out.update(by_count=by_count, by_time=by_time, bottleneck_count_s=P.bottleneck(times, by_count),
               bottleneck_time_s=P.bottleneck(times, by_time), predicted_gain=P.partition_gain(times, p))
    if ok:
        runs = {"count": _run(wl, [s[0] for s in by_count], m, p, quick)}
        runs["time"] = runs["count"] if by_time == by_count else _run(wl, [s[0] for s in by_time], m, p, quick)
        out.update(throughput_count=runs["count"]["throughput"], throughput_time=runs["time"]["throughput"],
                   measured_gain=runs["time"]["throughput"] / runs["count"]["throughput"],
                   same_partition=by_time == by_count, schedule="gpipe", backend=runs["count"]["backend"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preflight.bench.workload_pipeline", description=__doc__.split("\n")[0])
    ap.add_argument("--entry", required=True)
    ap.add_argument("--base", default=".")
    ap.add_argument("--out", required=True)
    ap.add_argument("--partition", required=True, help="first block index of each stage, e.g. 0,3")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--name", default="run")
    a = ap.parse_args(argv)
    worker(a.entry, a.base, a.out, [int(x) for x in a.partition.split(",")], a.microbatches, a.steps, a.name)
    return 0


if __name__ == "__main__":
    exit_worker(main)
