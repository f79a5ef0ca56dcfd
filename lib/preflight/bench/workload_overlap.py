"""Chapter 3 on your own model: DistributedDataParallel on the workload, two ranks.

The same questions as ``preflight.bench.overlap`` asks of its layer stack, asked of the workload's
model, optimizer and loss: how many bytes of gradients one step really moves, in how many buckets,
what bucket sizes, the fp16 / bf16 compression hooks and ``no_sync()`` accumulation do to the step,
and how far each moves the loss from the fp32 average (its own loss, on a held-out batch, after the
same updates). Configurations (``CONFIGS``): ``compute_only`` (each rank alone), ``manual_allreduce``
(one flat all-reduce after backward: nothing to overlap with), DDP with 1 MiB, default (25 MiB) and
one huge bucket, the fp16 and bf16 hooks, 4 micro-batches per update with 3 under ``no_sync()``.

Each rank trains on its own share of the workload's batch stream (batches ``rank, rank + world, ...``,
as a distributed sampler splits a dataset), a few fixed batches cycled so the timing holds no data
loading. Every configuration starts from the same initial weights and draws its dropout from
generators of its own, so the fp32 configurations stay comparable; they run interleaved (a warm-up,
then rounds), and the step is the slowest rank's median. The buckets are DDP's own: a recording
comm hook counts them and their bytes on the last step (DDP rebuilds its buckets after the first).

Real compute: on GPUs with NCCL this is the real overlap; on a CPU (gloo) backward keeps the cores
busy and the all-reduce cannot hide behind it (the chapter's emulated-device mode shows overlap on
the reference stack; a workload's layers cannot be emulated), so the CPU rows are labelled as such.

    torchrun --nproc_per_node=2 -m preflight.bench.workload_overlap --entry my_workload.py:build \\
        --base DIR --out DIR [--quick]
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
from pathlib import Path

from preflight.bench import exit_worker
from preflight.bench.overlap import average_gradients
from preflight.records import Method

METHOD = Method("workload_overlap", 1, required=("workload", "mode", "label", "rows", "world_size", "grad_bytes",
                                                 "buckets"))
CONFIGS = ("compute_only", "manual_allreduce", "ddp_bucket_small", "ddp_bucket_default", "ddp_bucket_huge",
           "ddp_fp16_hook", "ddp_bf16_hook", "ddp_no_sync_k4")
NUMERICS = {"compute_only": "local gradients, no averaging", "ddp_fp16_hook": "fp16 gradients",
            "ddp_bf16_hook": "bf16 gradients", "ddp_no_sync_k4": "4 micro-batches per update"}
ACCUM_K, FIXED_BATCHES, ROUNDS = 4, 4, 3


def _runner(config: str, wl, init_state, batches, device, world: int, rng_seed: int):
    """A fresh copy of the model trained under ``config``: (step, k, finish, buckets). ``buckets``
    fills with the bucket sizes (bytes) DDP all-reduced on the most recent step."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from preflight import hooks
    from preflight.bench.trainloop import rng_state, set_rng_state

    model = copy.deepcopy(wl.model).to(device)
    model.load_state_dict(init_state)
    params = [p for p in model.parameters() if p.requires_grad]
    net, k, seen, buckets = model, 1, {"batches": 0, "updates": 0}, []
    if config.startswith("ddp_"):
        cap = {"ddp_bucket_small": 1, "ddp_bucket_huge": sum(p.numel() * p.element_size() for p in params) // 2**20 + 2}
        net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                  bucket_cap_mb=cap.get(config))
        inner = {"ddp_fp16_hook": hooks.fp16_compress_hook, "ddp_bf16_hook": hooks.bf16_compress_hook}.get(
            config, default_hooks.allreduce_hook)

        def recording(state, bucket):
            if bucket.index() == 0:
                buckets.clear()
            buf = bucket.buffer()
            buckets.append(buf.numel() * buf.element_size())
            return inner(state, bucket)

        net.register_comm_hook(None, recording)
        k = ACCUM_K if config.startswith("ddp_no_sync") else 1
    opt = wl.make_optimizer(params)
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
                    wl.step_loss(x, y, net).backward()
            if config == "manual_allreduce":
                average_gradients(params, flat, world)      # the reference bench's, one home
            opt.step()
            seen["updates"] += 1
        finally:
            own_rng["state"] = rng_state()
            set_rng_state(outer)

    def finish(held_out):
        model.eval()
        with torch.no_grad():
            loss = float(wl.step_loss(*held_out, model))
        return loss, seen["updates"]

    return step, k, finish, buckets


def worker(entry: str, base: str, out, steps: int = 8, quick: bool = False) -> dict | None:
    """One rank: every configuration; rank 0 writes the record and returns it."""
    import torch
    import torch.distributed as dist

    from preflight.bench.launch import init_distributed
    from preflight.records import save_record
    from preflight.timing import summarize, time_fn
    from preflight.workload import load, to_device

    de, device = init_distributed(timeout=datetime.timedelta(seconds=300))
    rank, world = de["rank"], de["world_size"]
    try:
        wl = load(entry, base)                           # seeded: the same initial weights on every rank
        init = copy.deepcopy(wl.model.state_dict())
        held_out = tuple(to_device(t, device) for t in wl.batch())
        stream = [wl.batch() for _ in range(FIXED_BATCHES * world)]
        batches = [tuple(to_device(t, device) for t in b) for b in stream[rank::world]]
        runners = {c: _runner(c, wl, init, batches, device, world, rng_seed=1000 + rank) for c in CONFIGS}
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
            rows.append({"config": config, "step_s": float(med), "loss_after_n": loss, "updates": updates,
                         "buckets": len(buckets), "bucket_bytes": list(buckets),
                         "numerics": NUMERICS.get(config, "fp32 average")})
            fp32 = loss if config == "ddp_bucket_default" else fp32
        record = None
        if rank == 0:
            record = _record(wl, rows, fp32, world, device, dist.get_backend(), steps, quick)
            save_record(record, out, name=f"n{world}")
        dist.barrier()
        return record
    finally:
        dist.destroy_process_group()


def _record(wl, rows, fp32_loss, world, device, backend, steps, quick) -> dict:
    from preflight.bench.overlap import comm_bytes_per_step

    params = [p for p in wl.model.parameters() if p.requires_grad]
    shapes = [tuple(p.shape) for p in params]
    by = {r["config"]: r for r in rows}
    base, ref = by["compute_only"]["step_s"], by["manual_allreduce"]["step_s"]
    for r in rows:
        r.update(exposed_comm_s=r["step_s"] - base, saving_vs_no_overlap_s=ref - r["step_s"],
                 bytes_per_step_per_rank=comm_bytes_per_step(r["config"], shapes, world, k=ACCUM_K),
                 loss_rel_diff_vs_fp32=abs(r["loss_after_n"] - fp32_loss) / abs(fp32_loss) if fp32_loss else None)
    results = {"workload": wl.describe(), "mode": "real", "label": f"real ({device.type}, {backend})",
               "backend": backend, "world_size": world, "rows": rows, "params": sum(p.numel() for p in params),
               "grad_bytes": sum(p.numel() * p.element_size() for p in params),
               "buckets": {c: by[c]["bucket_bytes"] for c in ("ddp_bucket_small", "ddp_bucket_default", "ddp_bucket_huge")},
               "device_kind": device.type, "steps": steps, "cpu_note": device.type == "cpu"}
    return METHOD.record({"workload": wl.describe(), "quick": quick, "accumulation_k": ACCUM_K, "rounds": ROUNDS},
                         results)


def measure(wl, nproc: int = 2, quick: bool = False, timeout: float = 600.0) -> dict:
    """Method ``workload_overlap``: the worker under ``torchrun --standalone`` with ``nproc`` ranks."""
    from preflight.bench.launch import max_processes, run_torchrun, torchrun_cmd

    steps = 6 if quick else 12
    with tempfile.TemporaryDirectory(prefix="preflight-wloverlap-") as tmp:
        env = dict(os.environ, TMPDIR=tmp)
        if max_processes()[1].startswith("processes"):
            env["OMP_NUM_THREADS"] = "1"
        cmd = torchrun_cmd(nproc, "preflight.bench.workload_overlap", "--entry", wl.entry, "--base", wl.base_dir,
                           "--out", tmp, "--steps", str(steps))
        run_torchrun(cmd + (["--quick"] if quick else []), env, timeout)
        return json.loads((Path(tmp) / f"{METHOD.name}-n{nproc}.json").read_text())["results"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preflight.bench.workload_overlap", description=__doc__.split("\n")[0])
    ap.add_argument("--entry", required=True)
    ap.add_argument("--base", default=".")
    ap.add_argument("--out", required=True, help="rank 0 writes workload_overlap-n<N>.json here")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    worker(args.entry, args.base, args.out, args.steps, args.quick)
    return 0


if __name__ == "__main__":
    exit_worker(main)
