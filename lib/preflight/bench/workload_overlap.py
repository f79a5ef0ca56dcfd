"""Chapter 3 on your own model: DistributedDataParallel on the workload, two ranks.

The same questions as ``preflight.bench.overlap`` asks of its layer stack, asked of the workload's
model, optimizer and loss: how many bytes of gradients one step really moves, in how many buckets,
what bucket sizes, the fp16 / bf16 compression hooks and ``no_sync()`` accumulation do to the step,
and how far each moves the loss from the fp32 average (its own loss, on a held-out batch, after the
same updates). Configurations (``CONFIGS``): ``compute_only`` (each rank alone), ``manual_allreduce``
(one flat all-reduce after backward: nothing to overlap with), DDP with small (``bucket_caps_mb``:
1 MiB, less for a model under 4 MiB of gradients), default (25 MiB) and one huge bucket, the fp16
and bf16 hooks, 4 micro-batches per update with 3 under ``no_sync()``.

Each rank trains on its own share of the workload's batch stream (batches ``rank, rank + world, ...``,
as a distributed sampler splits a dataset), a few fixed batches cycled so the timing holds no data
loading. Every configuration starts from the same initial weights and draws its dropout from
generators of its own, so the fp32 configurations stay comparable; they run interleaved (a warm-up,
then rounds), and the step is the slowest rank's median. The buckets are DDP's own: a recording
comm hook counts them and their bytes on the last step (DDP rebuilds its buckets after the first).

``real`` mode (the default): real compute. On GPUs with NCCL this is the real overlap; on a CPU
(gloo) backward keeps the cores busy and the all-reduce cannot hide behind it, so the CPU rows are
labelled as such. ``emulated`` mode (the emulated device, always the CPU): rank 0 times each of the
workload's blocks (forward + backward, ``workload_pipeline.block_times``, one thread) and every rank
builds the workload as a stack of ``emulated.emulated_block``: one per block, holding copies of that
block's trainable parameters (``emulated_groups``: parameters outside every block in a block without
time before or after them), whose forward waits a third and backward two thirds of the block's
measured time (backward ~ 2x forward, as in 6N FLOPs per token) while the cores stay free. Its
gradients are real tensors of the workload's shapes, so DDP builds the workload's own buckets and
all-reduces them for real: the overlap an accelerator that computes at this CPU's measured pace
would get. No loss there (the waits compute nothing); the update is plain SGD. ``emulated_blocks``
in the record: each block's wait.

    torchrun --nproc_per_node=2 -m preflight.bench.workload_overlap --entry my_workload.py:build \\
        --base DIR --out DIR [--mode emulated] [--quick]
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import math
import os
import tempfile
import time
from pathlib import Path

from preflight.bench.overlap import average_gradients, launched_in_backward
from preflight.bench.workload_pipeline import block_modules
from preflight.core.records import Method
from preflight.harness.launch import exit_worker

# version 2: results["mode"] is "real" or "emulated" (rows without a loss); version 1 was real only
METHOD = Method("workload_overlap", 2, required=("workload", "mode", "label", "rows", "world_size", "grad_bytes",
                                                 "buckets"), runs_on="ranks")
MODES = ("real", "emulated")
CONFIGS = ("compute_only", "manual_allreduce", "ddp_bucket_small", "ddp_bucket_default", "ddp_bucket_huge",
           "ddp_fp16_hook", "ddp_bf16_hook", "ddp_no_sync_k4")
NUMERICS = {"compute_only": "local gradients, no averaging", "ddp_fp16_hook": "fp16 gradients",
            "ddp_bf16_hook": "bf16 gradients", "ddp_no_sync_k4": "4 micro-batches per update"}
ACCUM_K, FIXED_BATCHES, ROUNDS = 4, 4, 3


def bucket_caps_mb(params) -> dict:
    """``bucket_cap_mb`` of the small and huge configurations (default: DDP's own). Small: 1 MiB, or a
    quarter of the gradients when they are smaller, so that a small model still makes several buckets
    (a given cap also caps DDP's first bucket). Huge: larger than all the gradients (one bucket)."""
    grad_mb = sum(p.numel() * p.element_size() for p in params) / 2**20
    return {"ddp_bucket_small": min(1.0, grad_mb / 4), "ddp_bucket_huge": int(grad_mb) + 2}


def _runner(config: str, model, step_loss, make_optimizer, batches, device, world: int, rng_seed: int):
    """``model`` (a fresh copy, on ``device``) trained under ``config`` with ``step_loss(x, y, net)``
    and ``make_optimizer(params)``: (step, k, finish, buckets). ``buckets["bytes"]`` fills with the sizes
    of the buckets DDP all-reduced on the most recent step, ``buckets["launched"]`` with when each
    all-reduce was launched (``perf_counter``)."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from preflight.harness.trainloop import rng_state, set_rng_state
    from preflight.toolkit import hooks

    params = [p for p in model.parameters() if p.requires_grad]
    net, k, seen, buckets = model, 1, {"batches": 0, "updates": 0}, {"bytes": [], "launched": []}
    if config.startswith("ddp_"):
        net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                  bucket_cap_mb=bucket_caps_mb(params).get(config))
        inner = {"ddp_fp16_hook": hooks.fp16_compress_hook, "ddp_bf16_hook": hooks.bf16_compress_hook}.get(
            config, default_hooks.allreduce_hook)

        def recording(state, bucket):
            if bucket.index() == 0:
                buckets["bytes"].clear()
                buckets["launched"].clear()
            buf = bucket.buffer()
            buckets["bytes"].append(buf.numel() * buf.element_size())
            buckets["launched"].append(time.perf_counter())
            return inner(state, bucket)

        net.register_comm_hook(None, recording)
        k = ACCUM_K if config.startswith("ddp_no_sync") else 1
    opt = make_optimizer(params)
    torch.manual_seed(rng_seed)                 # every configuration: the same dropout stream
    own_rng = {"state": rng_state()}
    flat = torch.empty(sum(p.numel() for p in params), device=device)

    def step():
        outer = rng_state()
        set_rng_state(own_rng["state"])
        try:
            opt.zero_grad(set_to_none=True)
            for j in range(k):
                x, y = batches[seen["batches"] % len(batches)]
                seen["batches"] += 1
                with net.no_sync() if j < k - 1 else contextlib.nullcontext():
                    step_loss(x, y, net).backward()
            if config == "manual_allreduce":
                average_gradients(params, flat, world)      # the reference bench's, one home
            opt.step()
            seen["updates"] += 1
        finally:
            own_rng["state"] = rng_state()
            set_rng_state(outer)

    def finish(held_out):
        """(held-out loss or None without ``held_out``, updates)."""
        if held_out is None:
            return None, seen["updates"]
        model.eval()
        with torch.no_grad():
            loss = float(step_loss(*held_out, model))
        return loss, seen["updates"]

    return step, k, finish, buckets


def emulated_groups(wl, times: list[dict]) -> list[tuple[str, list, dict]]:
    """The emulated blocks' contents: ``[(name, parameters, wait)]`` in forward order, ``wait`` =
    ``{name, params, forward_s, backward_s}`` from ``times`` (``block_times`` rows; forward a third of
    the block's time, backward two thirds). Each trainable parameter once, in the first block that holds
    it; parameters outside every block go into a block without time before the blocks, or after them,
    by where ``model.parameters()`` yields them: the order DDP's first buckets assume (an embedding
    before the first block, an untied head after the last; a module's own parameters before its
    children's)."""
    seen, groups = set(), []
    for (name, mod), t in zip(block_modules(wl), times):
        ps = [p for p in mod.parameters() if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in ps)
        groups.append((name, ps, t["time_s"]))
    before, after, past_first_block = [], [], False
    for p in wl.model.parameters():
        past_first_block = past_first_block or id(p) in seen
        if p.requires_grad and id(p) not in seen:
            (after if past_first_block else before).append(p)
    groups = ([("(before the blocks)", before, 0.0)] if before else []) + groups + (
        [("(after the blocks)", after, 0.0)] if after else [])
    return [(n, ps, {"name": n, "params": sum(p.numel() for p in ps), "forward_s": t / 3, "backward_s": 2 * t / 3})
            for n, ps, t in groups]


def emulated_stack(wl, times: list[dict], device, log: list | None = None):
    """The workload as emulated-device blocks (``emulated.emulated_block``) of ``emulated_groups``, on
    ``device``. ``log`` gets each block's backward end (``perf_counter``)."""
    from torch import nn

    from preflight.harness.emulated import emulated_block

    return nn.Sequential(*(emulated_block(ps, w["forward_s"], w["backward_s"], log)
                           for _, ps, w in emulated_groups(wl, times))).to(device)


def worker(entry: str, base: str, out, steps: int = 8, quick: bool = False, mode: str = "real") -> dict | None:
    """One rank: every configuration; rank 0 writes the record and returns it. ``emulated``: rank 0
    times the blocks once and broadcasts the times, so every rank waits alike."""
    import torch
    import torch.distributed as dist

    from preflight.bench.workload_pipeline import block_times
    from preflight.core.records import save_record
    from preflight.core.timing import summarize, time_fn
    from preflight.core.workload import load, to_device
    from preflight.harness.launch import init_distributed

    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
    # emulated: the other ranks wait in the broadcast while rank 0 times the blocks (long on a large model)
    de, device = init_distributed(use_gpu=mode == "real",
                                  timeout=datetime.timedelta(seconds=1800 if mode == "emulated" else 300))
    rank, world = de["rank"], de["world_size"]
    try:
        wl = load(entry, base)                           # seeded: the same initial weights on every rank
        waits = None
        if mode == "emulated":
            shared = [block_times(wl, "cpu", quick=quick) if rank == 0 else None]
            dist.broadcast_object_list(shared, src=0)
            held_out, batches = None, [(torch.zeros(1, requires_grad=True), None)]   # every block's backward runs

            logs = {c: [] for c in CONFIGS}         # each configuration's blocks' backward ends

            def make(config):
                return emulated_stack(wl, shared[0], device, logs[config])

            def step_loss(x, _y, net):
                return net(x).sum()

            def make_optimizer(params):
                return torch.optim.SGD(params, lr=1e-3)
            waits = [w for _, _, w in emulated_groups(wl, shared[0])]
        else:
            init = copy.deepcopy(wl.model.state_dict())
            held_out = tuple(to_device(t, device) for t in wl.batch())
            stream = [wl.batch() for _ in range(FIXED_BATCHES * world)]
            batches = [tuple(to_device(t, device) for t in b) for b in stream[rank::world]]

            def make(_config):
                model = copy.deepcopy(wl.model).to(device)
                model.load_state_dict(init)
                return model
            step_loss, make_optimizer = wl.step_loss, wl.make_optimizer
        runners = {c: _runner(c, make(c), step_loss, make_optimizer, batches, device, world, rng_seed=1000 + rank)
                   for c in CONFIGS}
        samples = {c: [] for c in CONFIGS}
        for rnd in range(ROUNDS + 1):                     # round 0: warm-up (DDP builds its buckets)
            for config, (step, k, _, _) in runners.items():
                dist.barrier()
                if rnd == 0:
                    for _ in range(2):
                        step()
                    continue
                t = time_fn(step, device=device, warmup=0, repeats=max(1, math.ceil(steps / ROUNDS / k)))
                samples[config] += [x / k for x in t.samples_s]
        rows, fp32 = [], None
        for config, (_, _, finish, buckets) in runners.items():
            med = torch.tensor([summarize(samples[config]).median_s], dtype=torch.float64, device=device)
            dist.all_reduce(med, op=dist.ReduceOp.MAX)
            loss, updates = finish(held_out)
            row = {"config": config, "step_s": float(med), "updates": updates, "buckets": len(buckets["bytes"]),
                   "bucket_bytes": list(buckets["bytes"]), "numerics": NUMERICS.get(config, "fp32 average")}
            if held_out is not None:
                row["loss_after_n"] = loss
            elif buckets["launched"]:       # emulated: the last step's buckets launched before backward ended
                logs[config].clear()        # one more (untimed) step, its compute events logged
                runners[config][0]()
                row["launched_in_backward"] = launched_in_backward(buckets["launched"], max(logs[config]))
            rows.append(row)
            fp32 = loss if config == "ddp_bucket_default" else fp32
        record = None
        if rank == 0:
            record = _record(wl, rows, fp32, world, device, dist.get_backend(), steps, quick, mode, waits)
            save_record(record, out, name=f"{mode}-n{world}")
        dist.barrier()
        return record
    finally:
        dist.destroy_process_group()


def _record(wl, rows, fp32_loss, world, device, backend, steps, quick, mode="real", waits=None) -> dict:
    from preflight.bench.overlap import comm_bytes_per_step

    params = [p for p in wl.model.parameters() if p.requires_grad]
    shapes = [tuple(p.shape) for p in params]
    by = {r["config"]: r for r in rows}
    base, ref = by["compute_only"]["step_s"], by["manual_allreduce"]["step_s"]
    for r in rows:
        r.update(exposed_comm_s=r["step_s"] - base, saving_vs_no_overlap_s=ref - r["step_s"],
                 bytes_per_step_per_rank=comm_bytes_per_step(r["config"], shapes, world, k=ACCUM_K))
        if "loss_after_n" in r:
            r["loss_rel_diff_vs_fp32"] = abs(r["loss_after_n"] - fp32_loss) / abs(fp32_loss) if fp32_loss else None
    label = (f"emulated device ({backend}; the blocks' measured times as waits)" if mode == "emulated"
             else f"real ({device.type}, {backend})")
    results = {"workload": wl.describe(), "mode": mode, "label": label,
               "backend": backend, "world_size": world, "rows": rows, "params": sum(p.numel() for p in params),
               "grad_bytes": sum(p.numel() * p.element_size() for p in params),
               "buckets": {c: by[c]["bucket_bytes"] for c in ("ddp_bucket_small", "ddp_bucket_default", "ddp_bucket_huge")},
               "device_kind": device.type, "steps": steps, "cpu_note": mode == "real" and device.type == "cpu"}
    if waits is not None:
        results["emulated_blocks"] = waits
    return METHOD.record({"workload": wl.describe(), "quick": quick, "mode": mode, "accumulation_k": ACCUM_K,
                          "rounds": ROUNDS, "bucket_cap_mb": bucket_caps_mb(params)}, results)


def measure(wl, nproc: int = 2, quick: bool = False, timeout: float = 600.0, mode: str = "real") -> dict:
    """Method ``workload_overlap``: the worker under ``torchrun --standalone`` with ``nproc`` ranks."""
    from preflight.harness.launch import max_processes, run_torchrun, torchrun_cmd

    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
    steps = 6 if quick else 12
    with tempfile.TemporaryDirectory(prefix="preflight-wloverlap-") as tmp:
        env = dict(os.environ, TMPDIR=tmp)
        if mode == "emulated" or max_processes()[1].startswith("processes"):
            env["OMP_NUM_THREADS"] = "1"
        cmd = torchrun_cmd(nproc, "preflight.bench.workload_overlap", "--entry", wl.entry, "--base", wl.base_dir,
                           "--out", tmp, "--steps", str(steps), "--mode", mode)
        run_torchrun(cmd + (["--quick"] if quick else []), env, timeout)
        return json.loads((Path(tmp) / f"{METHOD.name}-{mode}-n{nproc}.json").read_text())["results"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preflight.bench.workload_overlap", description=__doc__.split("\n")[0])
    ap.add_argument("--entry", required=True)
    ap.add_argument("--base", default=".")
    ap.add_argument("--out", required=True, help="rank 0 writes workload_overlap-<mode>-n<N>.json here")
    ap.add_argument("--mode", choices=MODES, default="real",
                    help="real compute (default), or the emulated device: the blocks' measured times as waits")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    worker(args.entry, args.base, args.out, args.steps, args.quick, args.mode)
    return 0


if __name__ == "__main__":
    exit_worker(main)
