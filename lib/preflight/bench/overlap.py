"""Where DDP's communication goes: hidden behind backward, or added to the step.

Each rank trains the same stack of layers on its own fixed data under each configuration, all measured
alike and interleaved (a warm-up round, then rounds of a few timed steps each, so a drifting background
load hits every configuration): median step, slowest rank. ``exposed_comm_s = step_s -
step_s(compute_only)``: what communication adds; ``saving_vs_no_overlap_s = step_s(manual_allreduce) -
step_s``. Bytes are computed: ring all-reduce moves ``2 (n-1)/n`` x the buffer per rank.

- ``compute_only``: each rank alone, no communication. ``manual_allreduce``: no DDP; all gradients
  copied into one kept flat buffer and all-reduced after backward: the no-overlap reference.
- ``ddp_bucket_small`` / ``_default`` / ``_huge``: ``bucket_cap_mb`` 1, DDP's default (25 MiB after a
  1 MiB first bucket), and larger than the model (one bucket: it starts when backward ends). A bucket
  is all-reduced as soon as its gradients exist, during the rest of backward; the last one (the first
  layer's gradients) can never hide. Against an 8 MB model the default is nearly one bucket: 25 MiB
  suits models of GBs, where it makes hundreds.
- ``ddp_fp16_hook`` / ``ddp_bf16_hook``: half the bytes (torch's fp16 hook, ``preflight.toolkit.hooks``' bf16);
  ``ddp_powersgd``: PowerSGD rank 2, compressing after ``start_powerSGD_iter=10`` (the warm-up).
- ``ddp_no_sync_k4``: 4 micro-batches per update, 3 under ``ddp.no_sync()``: time and bytes per
  micro-batch (its exposed time also sheds 3 optimizer steps in 4; its loss is a different schedule).

``real`` mode: Linear+ReLU layers on the CPU (gloo) or ``cuda:LOCAL_RANK`` (NCCL). On a CPU overlap
cannot show: backward keeps the rank's core busy and gloo's thread waits for it (field notes).
``emulated`` mode ("emulated device", ``bench.emulated``): each layer's forward and backward are timed
waits that free the CPU as a GPU kernel frees the host, and gradients are real tensors of the
parameters' shapes, so DDP buckets and all-reduces them for real: an accelerator's overlap, measured
on a laptop.

Real mode adds ``loss_after_n`` (eval loss after ``updates`` steps, same seeds) and
``loss_rel_diff_vs_fp32`` (vs ``ddp_bucket_default``): bucketing and the manual average match it, the
16-bit hooks and PowerSGD change the numerics. PowerSGD on gloo runs each bucket in its own process
group (see ``_runner``: torch's hook otherwise crashes or hangs there with 2+ buckets).

    torchrun --nproc_per_node=2 -m preflight.bench.overlap --mode emulated --out DIR [--quick]
    run_overlap("emulated")          # the same under torchrun --standalone; a DataFrame
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import tempfile
import time
from pathlib import Path

from preflight.core.records import Method
from preflight.harness.emulated import emulated_block
from preflight.harness.launch import exit_worker

METHOD = Method("overlap", 1, required=("mode", "label", "rows", "world_size"), runs_on="ranks")
CONFIGS = ("compute_only", "manual_allreduce", "ddp_bucket_small", "ddp_bucket_default", "ddp_bucket_huge",
           "ddp_fp16_hook", "ddp_bf16_hook", "ddp_powersgd", "ddp_no_sync_k4")
NUMERICS = {"compute_only": "local gradients, no averaging", "ddp_fp16_hook": "fp16 gradients",
            "ddp_bf16_hook": "bf16 gradients", "ddp_powersgd": "PowerSGD rank 2 + error feedback",
            "ddp_no_sync_k4": "4 micro-batches per update"}          # the rest: fp32 average
# How a page names each configuration (tables, charts); the keys stay in the records.
CONFIG_LABELS = {"compute_only": "compute only (no communication)", "manual_allreduce": "all-reduce after backward",
                 "ddp_bucket_small": "DDP, 1 MB buckets", "ddp_bucket_default": "DDP, 25 MB buckets (default)",
                 "ddp_bucket_huge": "DDP, one bucket (no overlap)", "ddp_fp16_hook": "DDP + fp16 compression hook",
                 "ddp_bf16_hook": "DDP + bf16 compression hook", "ddp_powersgd": "DDP + PowerSGD (rank 2)",
                 "ddp_no_sync_k4": "DDP, no_sync over 4 micro-batches"}
POWERSGD_RANK, POWERSGD_START, ACCUM_K = 2, 10, 4
ROUNDS = 4
WARMUP = POWERSGD_START + 2          # every configuration, so that PowerSGD compresses when timed
# (layers, hidden, batch, lr, forward ms per layer, backward ms per layer)
SETUPS = {"emulated": (8, 512, 8, 1e-3, 1.0, 2.0), "real": (8, 512, 64, 0.02, None, None),
          "real-quick": (4, 256, 32, 0.02, None, None)}


def comm_bytes_per_step(config: str, shapes, world_size: int, k: int = ACCUM_K,
                        powersgd_rank: int = POWERSGD_RANK, elem_bytes: int = 4) -> float:
    """Bytes each rank sends per (micro-)step under ``config``, for parameters of ``shapes``.

    Ring all-reduce moves ``2 (n-1)/n`` x the buffer. fp16/bf16 hooks: half. PowerSGD: each matrix
    (``shape[0]`` x the rest) becomes ``(rows + cols) x rank`` values (P and Q), unless that is not 2x
    smaller (``min_compression_rate``): vectors then go uncompressed, as in torch's hook.
    """
    from preflight.models.comm import busbw_factor

    numel = [math.prod(s) for s in shapes]
    factor = busbw_factor(world_size) * elem_bytes
    if config == "compute_only" or world_size < 2:
        return 0.0
    if config in ("ddp_fp16_hook", "ddp_bf16_hook"):
        return sum(numel) * factor / 2
    if config == "ddp_powersgd":
        total = 0
        for s, n_el in zip(shapes, numel):
            rows = s[0]
            cols = n_el // rows
            r = min(rows, cols, powersgd_rank)
            total += (rows + cols) * r if (rows + cols) * r * 2 < n_el else n_el
        return total * factor
    return sum(numel) * factor / (k if config.startswith("ddp_no_sync") else 1)


def _make_model(mode: str, layers: int, hidden: int, fwd_s: float, bwd_s: float, device, seed: int = 0,
                log: list | None = None):
    """The stack; emulated, each layer an ``emulated_block`` of a Linear's weight and bias."""
    import torch
    from torch import nn

    torch.manual_seed(seed)                    # the same initial weights on every rank
    mods = []
    for i in range(layers):
        lin = nn.Linear(hidden, hidden)
        nn.init.kaiming_normal_(lin.weight, nonlinearity="relu")
        nn.init.zeros_(lin.bias)
        if mode == "emulated":
            mods.append(emulated_block([lin.weight, lin.bias], fwd_s, bwd_s, log))
        else:
            mods += [lin, nn.ReLU()] if i < layers - 1 else [lin]
    return nn.Sequential(*mods).to(device)


def average_gradients(params, flat, world: int) -> None:
    """The no-overlap reference: every gradient into one kept buffer (``flat``, as DDP's buckets), one
    all-reduce after backward, divided by the world size, copied back. Nothing to overlap with."""
    import torch
    import torch.distributed as dist

    torch.cat([p.grad.reshape(-1) for p in params], out=flat)
    dist.all_reduce(flat)
    flat.div_(world)
    for p, avg in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(avg.view_as(p))


def _runner(config, mode, setup, device, rank, world, trace: dict | None = None):
    """A fresh model trained under ``config``: (step, k micro-batches per step, finish). ``step()`` is one
    update; ``finish()`` -> (eval loss, updates, PowerSGD measured compression ratio or None). With
    ``trace`` (a bucket configuration, untimed): ``trace["compute"]`` gets each layer's backward end,
    ``trace["comm"]`` each bucket's (bytes, all-reduce launched, done), from a recording all-reduce hook."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    from preflight.toolkit import hooks

    layers, hidden, batch, lr, fwd_ms, bwd_ms = setup
    model = _make_model(mode, layers, hidden, (fwd_ms or 0) / 1e3, (bwd_ms or 0) / 1e3, device,
                        log=trace["compute"] if trace else None)
    params = list(model.parameters())
    teacher = torch.randn(hidden, hidden, generator=torch.Generator().manual_seed(7)) / hidden ** 0.5
    gen = torch.Generator().manual_seed(1000 + rank)           # each rank its own fixed data
    xs = [torch.randn(batch, hidden, generator=gen) for _ in range(4)]
    batches = [(x.to(device), (x @ teacher).to(device)) for x in xs]
    net, k, state = model, 1, None
    if config.startswith("ddp_"):
        cap = {"ddp_bucket_small": 1, "ddp_bucket_default": None,
               "ddp_bucket_huge": sum(p.numel() * 4 for p in params) // 2**20 + 2}.get(config)
        net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=cap)
        if trace is not None:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            def traced(pg, bucket):
                buf, t0 = bucket.buffer(), time.perf_counter()
                return default_hooks.allreduce_hook(pg, bucket).then(lambda fut: trace["comm"].append(
                    (buf.numel() * buf.element_size(), t0, time.perf_counter())) or fut.value())
            net.register_comm_hook(None, traced)
        elif config == "ddp_fp16_hook":
            net.register_comm_hook(None, hooks.fp16_compress_hook)
        elif config == "ddp_bf16_hook":
            net.register_comm_hook(None, hooks.bf16_compress_hook)
        elif config == "ddp_powersgd":
            state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=POWERSGD_RANK,
                                       start_powerSGD_iter=POWERSGD_START)
            hook = psgd.powerSGD_hook
            if dist.get_backend() == "gloo":
                # torch's hook issues each bucket's P and Q all-reduces from completion callbacks, so
                # with 2+ buckets in flight the ranks can issue them in different orders: gloo then
                # fails ("Received data size doesn't match") or its callback threads block on each
                # other (a hang). One process group per bucket keeps each bucket's chain apart.
                groups = [dist.new_group(backend="gloo") for _ in params]   # >= number of buckets

                def hook(st, bucket):
                    st.process_group = groups[bucket.index() % len(groups)]
                    return psgd.powerSGD_hook(st, bucket)
            net.register_comm_hook(state, hook)
        elif config.startswith("ddp_no_sync"):
            k = ACCUM_K
    opt = torch.optim.SGD(params, lr=lr)
    seen, flat = {"batches": 0, "updates": 0}, torch.empty(sum(p.numel() for p in params), device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        for j in range(k):
            x, y = batches[seen["batches"] % len(batches)]
            seen["batches"] += 1
            with net.no_sync() if j < k - 1 else contextlib.nullcontext():
                torch.nn.functional.mse_loss(net(x), y).backward()
        if config == "manual_allreduce":          # after backward, all at once: nothing to overlap with
            average_gradients(params, flat, world)
        opt.step()
        seen["updates"] += 1

    def finish():
        with torch.no_grad():
            x = torch.randn(256, hidden, generator=torch.Generator().manual_seed(999))
            loss = float(torch.nn.functional.mse_loss(model(x.to(device)), (x @ teacher).to(device)))
        ratio = None
        if state is not None and state.total_numel_before_compression:
            ratio = state.total_numel_after_compression / state.total_numel_before_compression
        return loss, seen["updates"], ratio

    return step, k, finish


def _measure(mode, setup, device, rank, world, steps, rounds=ROUNDS):
    """Every configuration, interleaved: warm-up each, then ``rounds`` rounds in which each runs
    ``steps / rounds`` timed steps (a drifting background load then hits them all alike).
    ``{config: (this rank's median s per micro-batch step, loss, updates, ratio)}``. Own function:
    the DDP objects and their reducers die before the process group does."""
    import torch.distributed as dist

    from preflight.core.timing import summarize, time_fn

    runners = {c: _runner(c, mode, setup, device, rank, world) for c in CONFIGS}
    samples = {c: [] for c in CONFIGS}
    per_round = math.ceil(steps / rounds)
    for rnd in range(rounds + 1):             # round 0: warm-up (PowerSGD starts compressing after it)
        for config, (step, k, _) in runners.items():
            dist.barrier()
            if rnd == 0:                      # no_sync: fewer updates, each of k micro-batches
                for _ in range(math.ceil(WARMUP / k)):
                    step()
                continue
            t = time_fn(step, device=device, warmup=0, repeats=max(2, math.ceil(per_round / k)))
            samples[config] += [x / k for x in t.samples_s]
    return {c: (summarize(samples[c]).median_s, *runners[c][2]()) for c in CONFIGS}


def launched_in_backward(launch_times, compute_end: float) -> int:
    """How many buckets' all-reduces were launched before the backward's last compute ended: the ones
    that had compute left to hide behind. The bucket holding the first layer's gradients fills only
    when the backward is over, so it never can. Times on one clock (``time.perf_counter``)."""
    return sum(t < compute_end for t in launch_times)


def _trace(config, setup, device, rank, world, steps: int = 3) -> dict:
    """A bucket configuration run untimed (emulated) with a recording all-reduce hook: its last step
    (DDP rebuilds its buckets after the first) as counts. ``launched_in_backward``: buckets whose
    all-reduce started before the last layer's backward ended, i.e. while there was compute to hide
    behind; the bucket holding the first layer's gradients never can. ``bytes``: what the buckets held."""
    trace = {"compute": [], "comm": []}
    step, _, _ = _runner(config, "emulated", setup, device, rank, world, trace=trace)
    for _ in range(steps):
        trace["compute"].clear()
        trace["comm"].clear()
        step()
    end = trace["compute"][-1]
    return {"buckets": len(trace["comm"]), "bytes": sum(b for b, _, _ in trace["comm"]),
            "launched_in_backward": launched_in_backward((t0 for _, t0, _ in trace["comm"]), end),
            "comm_s": sum(t1 - t0 for _, t0, t1 in trace["comm"]),
            "comm_s_in_backward": sum(max(0.0, min(t1, end) - t0) for _, t0, t1 in trace["comm"])}


def worker(mode: str, out, steps: int = 20, quick: bool = False) -> dict | None:
    """One rank: every configuration (``_measure``); rank 0 writes the record and returns it."""
    import datetime

    import torch
    import torch.distributed as dist

    from preflight.core.records import save_record
    from preflight.harness.launch import init_distributed

    # real mode: a GPU per local rank, else the CPU (init_distributed); emulated mode: always the CPU
    de, device = init_distributed(use_gpu=mode == "real", timeout=datetime.timedelta(seconds=120))
    world, backend = de["world_size"], dist.get_backend()
    setup = SETUPS["real-quick" if mode == "real" and quick else mode]
    try:
        results = {}
        for config, (med, loss, updates, ratio) in _measure(mode, setup, device, de["rank"], world,
                                                            steps).items():
            every = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(world)]
            dist.all_gather(every, torch.tensor([med], dtype=torch.float64, device=device))
            results[config] = (max(float(t) for t in every), loss, updates, ratio)
        traces = {c: _trace(c, setup, device, de["rank"], world) for c in CONFIGS
                  if mode == "emulated" and c.startswith("ddp_bucket")}
        gc.collect()
        record = None
        if de["rank"] == 0:
            layers, hidden, batch, lr, fwd_ms, bwd_ms = setup
            shapes = [tuple(p.shape) for p in _make_model(mode, layers, hidden, 0, 0, "cpu").parameters()]
            base, ref = results["compute_only"][0], results["manual_allreduce"][0]
            fp32_loss = results["ddp_bucket_default"][1]
            rows = []
            for config, (step_s, loss, updates, ratio) in results.items():
                row = {"config": config, "step_s": step_s, "exposed_comm_s": step_s - base,
                       "bytes_per_step_per_rank": comm_bytes_per_step(config, shapes, world),
                       "saving_vs_no_overlap_s": ref - step_s, "updates": updates,
                       "numerics": NUMERICS.get(config, "fp32 average")}
                if mode == "real":
                    row.update(loss_after_n=loss, loss_rel_diff_vs_fp32=abs(loss - fp32_loss) / fp32_loss)
                if ratio is not None:
                    row["powersgd_measured_ratio"] = ratio
                rows.append(row)
            n_params = sum(math.prod(s) for s in shapes)
            res = {"mode": mode, "label": "emulated device (timed waits)" if mode == "emulated" else
                   f"real ({device.type})", "backend": backend, "world_size": world, "rows": rows,
                   "params": n_params, "grad_bytes": n_params * 4, "device_kind": device.type,
                   "warmup_steps": WARMUP, "steps": steps, "omp_num_threads": torch.get_num_threads()}
            if mode == "emulated":
                res.update(forward_ms_per_layer=fwd_ms, backward_ms_per_layer=bwd_ms, bucket_trace=traces)
            params = {"layers": layers, "hidden": hidden, "batch": batch, "lr": lr, "quick": quick,
                      "powersgd_rank": POWERSGD_RANK, "start_powerSGD_iter": POWERSGD_START,
                      "accumulation_k": ACCUM_K, "rounds": ROUNDS,
                      "bucket_cap_mb": {"small": 1, "default": "25 (1 MiB first)", "huge": n_params * 4 // 2**20 + 2}}
            record = METHOD.record(params, res)
            save_record(record, out, name=f"{mode}-n{world}")
        dist.barrier()               # field notes: without it some runs abort at exit
        return record
    finally:
        dist.destroy_process_group()


def overlap_frame(record: dict):
    """The record's rows as a DataFrame (``attrs["record"]`` holds the record)."""
    import pandas as pd

    df = pd.DataFrame(record["results"]["rows"])
    df.attrs["record"] = record
    return df


def run_overlap(mode: str = "emulated", nproc: int = 2, out=None, quick: bool = False,
                timeout: float = 300.0, steps: int | None = None):
    """Run the worker under ``torchrun --standalone --nproc_per_node=nproc``; the table."""
    from preflight.harness.launch import max_processes, run_torchrun, torchrun_cmd

    if mode not in ("emulated", "real"):
        raise ValueError(f"mode must be 'emulated' or 'real' (got {mode!r})")
    steps = steps if steps is not None else (8 if quick else 20)
    with tempfile.TemporaryDirectory(prefix="preflight-overlap-") as tmp:
        out_dir = Path(out) if out is not None else Path(tmp) / "records"
        env = dict(os.environ, TMPDIR=tmp)
        if mode == "emulated" or max_processes()[1].startswith("processes"):
            env["OMP_NUM_THREADS"] = "1"
        cmd = torchrun_cmd(nproc, "preflight.bench.overlap", "--mode", mode, "--out", out_dir, "--steps", steps)
        run_torchrun(cmd + (["--quick"] if quick else []), env, timeout)
        record = json.loads((out_dir / f"{METHOD.name}-{mode}-n{nproc}.json").read_text())
    return overlap_frame(record)


def measure(mode: str = "emulated", quick: bool = False) -> dict:
    """Method ``overlap`` as chapter 3 runs it here: 2 ranks under torchrun; the record's results (the
    same record ``torchrun --nproc_per_node=N -m preflight.bench.overlap --mode MODE --out DIR`` writes)."""
    return run_overlap(mode, nproc=2, quick=quick).attrs["record"]["results"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preflight.bench.overlap",
                                 description="one rank of the DDP overlap measurement (under torchrun), "
                                             "or --launch N to start torchrun and print the table")
    ap.add_argument("--mode", choices=("emulated", "real"), default="emulated")
    ap.add_argument("--out", required=True, help="results folder (rank 0 writes overlap-<mode>-n<N>.json)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 20, 8 with --quick)")
    ap.add_argument("--quick", action="store_true", help="fewer steps; real mode: a smaller model")
    ap.add_argument("--launch", type=int, default=None, metavar="N", help="run torchrun with N processes")
    args = ap.parse_args(argv)
    if args.launch:
        df = run_overlap(args.mode, args.launch, out=args.out, quick=args.quick, steps=args.steps)
        print(df.to_string(index=False))
        return 0
    steps = args.steps if args.steps is not None else (8 if args.quick else 20)
    if worker(args.mode, args.out, steps=steps, quick=args.quick) is not None:
        print(f"overlap: record written to {args.out}")
    return 0


if __name__ == "__main__":
    exit_worker(main)
