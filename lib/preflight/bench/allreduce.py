"""All-reduce bandwidth sweep (nccl-tests style), and the alpha-beta model fitted to it.

Data parallelism all-reduces every gradient every step, so the all-reduce time of the interconnect at
the sizes your buckets have is the number that decides how far you can scale. This module measures
it: message sizes from a few KB to hundreds of MB, each timed many times across all ranks.

Two bandwidths, as nccl-tests reports them (``S`` bytes, ``t`` seconds, ``n`` ranks)::

    algbw = S / t                   what the application sees: "my S-byte buffer took t"
    busbw = algbw * 2 (n-1) / n     what each link carried, comparable across n

Why ``2 (n-1)/n``: a ring all-reduce is a reduce-scatter followed by an all-gather. In each half,
every rank sends ``n-1`` chunks of ``S/n`` bytes, so a rank moves ``2 (n-1)/n * S`` bytes in all.
busbw is therefore the bandwidth each rank's link really sustained; it approaches ``2 * algbw`` at
large n and can be compared directly with the link speed (and with runs at other n). For n=2 the
factor is exactly 1.

The alpha-beta model (``preflight.models.alphabeta.fit_alpha_beta``) describes the whole curve with two
numbers: a ring does ``2 (n-1)`` steps, each paying a latency ``alpha``, plus the bytes at bandwidth
``B``::

    t(S) = 2 (n-1) alpha  +  2 (n-1)/n * S / B

Small messages are latency-bound (t nearly flat in S), big ones bandwidth-bound (t linear in S): the
crossover ``S* ~ n alpha B`` says how large DDP buckets must be to use the network well. The fit is
done on relative error, so the small sizes count; per-size errors are kept in the record because a
real stack (protocol switches, eager/rendezvous thresholds) bends away from two straight lines.

Why medians: every iteration is the slowest rank's time (one late rank delays all), and on a shared
machine some iterations catch a scheduler tick or a daemon; the mean carries that tail (~4 ms on
this 2-core box), the median does not. p10 / p90 are kept to show the spread.

Ways in:

- the worker, one process per device, under ``torchrun --nproc_per_node=N -m preflight.bench.allreduce
  --out DIR`` or ``srun`` (one task per GPU); rank 0 writes ``allreduce-n{N}.json``
  (``allreduce-n{N}-nodes{M}.json`` across M nodes, with every rank's host and Slurm node in the
  record: two Slurm "nodes" on one host measure loopback, not a network);
- ``run_sweep(nproc=2)`` launches it here and returns the table; ``load_sweeps(DIR)`` reads records
  measured on a cluster (``--results``), ``sweep_frame(record)`` turns one into a table.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path

from preflight.core.records import Method
from preflight.harness.launch import exit_worker
from preflight.models.alphabeta import fit_alpha_beta
from preflight.models.comm import busbw_factor, ring_allreduce_time

METHOD = Method("allreduce", 1, required=("world_size", "backend", "rows", "fit"), runs_on="ranks")
DTYPES = {"float32": 4, "bfloat16": 2}
MAX_BYTES_LIMIT = 4 * 1024**3
QUICK_MAX_BYTES = 16 * 1024**2
SECONDS_PER_SIZE = 0.5        # timed iterations stop at K or after ~this much, whichever first
MIN_ITERS, WARMUP_ITERS, WARMUP_SECONDS = 5, 3, 0.2
COLUMNS = ["bytes", "time_s", "p10_s", "p90_s", "algbw_GBps", "busbw_GBps", "fit_time_s", "fit_rel_error"]


def message_sizes(min_bytes: int, max_bytes: int, factor: int = 4) -> list[int]:
    """``min * factor**k`` up to ``max`` (``max`` appended when the ladder misses it)."""
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    if sizes[-1] != max_bytes:
        sizes.append(max_bytes)
    return sizes


# --- the worker ---------------------------------------------------------------------------------------

def _sample(dist, buf, stat, device) -> float:
    """One all-reduce, timed on every rank, returned as the slowest rank's time (the same on all).

    A barrier first lines the ranks up; the MAX all-reduce of the times runs outside the timed region.
    On CUDA the device is synchronised before both clock reads, so the kernel, not the launch, is timed.
    """
    import torch

    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    dist.all_reduce(buf)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    stat.fill_(time.perf_counter() - t0)
    dist.all_reduce(stat, op=dist.ReduceOp.MAX)
    return float(stat.item())


def _sweep(dist, sizes, iters, dtype, device, world) -> list[dict]:
    import torch

    from preflight.core.timing import summarize

    esize = DTYPES[dtype]
    buf = torch.ones(max(sizes) // esize, dtype=getattr(torch, dtype), device=device)
    dist.all_reduce(buf[: sizes[0] // esize])            # correctness once: ones sum to n
    if not bool((buf[: sizes[0] // esize] == world).all()):
        raise RuntimeError(f"all_reduce of ones did not give {world}")
    buf.zero_()                       # zeros stay zeros: no overflow or inf however often we sum
    stat = torch.zeros(1, dtype=torch.float64, device=device)
    rows = []
    for size in sizes:
        view = buf[: size // esize]
        spent, k = 0.0, 0
        while k < WARMUP_ITERS and (k == 0 or spent < WARMUP_SECONDS):   # same decision on all ranks
            spent += _sample(dist, view, stat, device)
            k += 1
        samples: list[float] = []
        while len(samples) < iters and (len(samples) < min(MIN_ITERS, iters) or sum(samples) < SECONDS_PER_SIZE):
            samples.append(_sample(dist, view, stat, device))
        t = summarize(samples)
        nbytes = view.numel() * esize
        algbw = nbytes / t.median_s / 1e9
        rows.append({"bytes": nbytes, "time_s": t.median_s, "p10_s": t.p10_s, "p90_s": t.p90_s,
                     "algbw_GBps": algbw, "busbw_GBps": algbw * busbw_factor(world), "iters": len(samples)})
    return rows


def worker(out, sizes: list[int], iters: int = 50, dtype: str = "float32") -> dict | None:
    """One rank of the sweep; rank 0 writes and returns the record, other ranks return None."""
    import torch
    import torch.distributed as dist

    from preflight.core.device import probe
    from preflight.core.records import save_record
    from preflight.harness.launch import init_distributed

    de, device = init_distributed()
    try:
        world, load_before = de["world_size"], os.getloadavg()[0]
        where = [None] * world              # each rank's host and Slurm node: did the sweep cross machines?
        dist.all_gather_object(where, {"host": socket.gethostname(), "slurm_node": os.environ.get("SLURMD_NODENAME")})
        rows = _sweep(dist, sizes, iters, dtype, device, world)
        record = None
        if de["rank"] == 0:
            info = probe()
            fit, note = None, None
            try:
                fit = fit_alpha_beta([r["bytes"] for r in rows], [r["time_s"] for r in rows], world)
            except ValueError as exc:
                note = f"no alpha-beta fit: {exc}"
            results = {"world_size": world, "nodes": de["nodes"], "processes_per_node": de["local_world_size"],
                       "backend": dist.get_backend(), "launcher": de["launcher"], "device": info.name,
                       "device_kind": device.type, "busbw_factor": busbw_factor(world), "rows": rows,
                       "fit": fit, "fit_rel_error": fit["rel_error"] if fit else None, "notes": [note] if note else [],
                       "load_average_1m": [load_before, os.getloadavg()[0]],   # busy host: distrust
                       "hosts": sorted({w["host"] for w in where}),
                       "slurm_nodes": sorted({w["slurm_node"] for w in where if w["slurm_node"]})}
            params = {"sizes": sizes, "iters": iters, "dtype": dtype, "warmup_iters": WARMUP_ITERS,
                      "min_iters": MIN_ITERS, "seconds_per_size": SECONDS_PER_SIZE,
                      "omp_num_threads": torch.get_num_threads()}
            record = METHOD.record(params, results, device=info.as_dict())
            save_record(record, out, name=f"n{world}" + (f"-nodes{de['nodes']}" if de["nodes"] > 1 else ""))
        dist.barrier()                # field notes: without it ~1 run in 8 aborted at exit
        return record
    finally:
        dist.destroy_process_group()


# --- from Python: launch, read back, tabulate -----------------------------------------------------------

def sweep_frame(record: dict):
    """One row per message size: bytes, time_s (median of the slowest rank), p10_s, p90_s, algbw_GBps,
    busbw_GBps, fit_time_s (alpha-beta model), fit_rel_error (model / measured - 1); NaN without a fit.
    ``df.attrs["record"]`` is the record."""
    import pandas as pd

    res = record["results"]
    fit, n = res.get("fit"), int(res["world_size"])
    df = pd.DataFrame(res["rows"])
    if fit:
        df["fit_time_s"] = [ring_allreduce_time(s, n, fit["bandwidth_GBps"], fit["alpha_s"]) for s in df["bytes"]]
        df["fit_rel_error"] = df["fit_time_s"] / df["time_s"] - 1.0
    else:
        df["fit_time_s"] = df["fit_rel_error"] = float("nan")
    df = df[COLUMNS]
    df.attrs["record"] = record
    return df


def load_sweeps(folder) -> list[dict]:
    """Every all-reduce record under ``folder`` (e.g. measured on a cluster and passed as ``--results``),
    oldest first."""
    from preflight.core.records import load_records

    return load_records(folder, METHOD.name)


def run_sweep(nproc: int = 2, out=None, quick: bool = False, timeout: float = 300.0, iters: int | None = None,
              dtype: str = "float32", min_bytes: int = 4096, max_bytes: int | None = None):
    """Run the worker under ``torchrun --standalone --nproc_per_node=nproc`` here; ``sweep_frame`` of it.

    nproc above this machine's limit (CPU: usable cores, GPU: device count) raises ValueError: on the
    CPU each rank needs its own core (OMP_NUM_THREADS=1), and oversubscribed ranks measure the
    scheduler (field notes: 3-4 processes on 2 cores turn a 0.4 ms all-reduce into ~5 ms).
    """
    from preflight.harness.launch import max_processes, run_torchrun, torchrun_cmd

    limit, unit = max_processes()
    if not 1 <= nproc <= limit:
        raise ValueError(f"nproc={nproc}: this machine allows 1 to {limit} {unit}")
    args = ["--min-bytes", str(min_bytes), "--dtype", dtype]
    args += ["--max-bytes", str(max_bytes)] if max_bytes else []
    args += ["--iters", str(iters)] if iters else []
    args += ["--quick"] if quick else []
    with tempfile.TemporaryDirectory(prefix="preflight-allreduce-") as tmp:
        out_dir = Path(out) if out is not None else Path(tmp) / "records"
        env = dict(os.environ, TMPDIR=tmp)
        if unit.startswith("processes"):
            env["OMP_NUM_THREADS"] = "1"
        else:       # GPUs: keep NCCL's INFO log, so the chapter can show which transport it chose
            env.setdefault("NCCL_DEBUG", "INFO")
        log = run_torchrun(torchrun_cmd(nproc, "preflight.bench.allreduce", "--out", out_dir, *args), env, timeout)
        path = out_dir / f"{METHOD.name}-n{nproc}.json"
        record = json.loads(path.read_text())
    if out is not None:
        record["_path"] = str(path)
    df = sweep_frame(record)
    df.attrs["log"] = log
    return df


def measure(nproc: int = 2, quick: bool = False) -> dict:
    """Method ``allreduce`` as chapter 3 runs it on this machine: the sweep at ``nproc`` ranks (the
    record's results), with the NCCL_DEBUG=INFO lines of the run (GPUs; at most 400) as ``nccl_log``,
    so that the transports NCCL chose are read from the same record. Under torchrun / srun the
    worker writes this record itself (without the log: read the job's output with
    ``preflight.diagnose.nccl_log``)."""
    df = run_sweep(nproc=nproc, quick=quick)
    lines = [x for x in (df.attrs.get("log") or "").splitlines() if "NCCL INFO" in x]
    return dict(df.attrs["record"]["results"], nccl_log="\n".join(lines[:400]))


# --- command line -----------------------------------------------------------------------------------

def _nbytes(text: str) -> int:
    """``4096``, ``4K``, ``16M``, ``1G`` (binary units) -> bytes, checked against 4..4 GiB."""
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        n = int(t[:-1]) * mult[t[-1]] if t and t[-1] in mult else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (e.g. 4096, 64K, 256M)") from None
    if not 4 <= n <= MAX_BYTES_LIMIT:
        raise argparse.ArgumentTypeError(f"{text} is outside 4..{MAX_BYTES_LIMIT} bytes (4 GiB)")
    return n


def _iters(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 10000:
        raise argparse.ArgumentTypeError(f"{text!r} is outside 1..10000")
    return n


def parse_args(argv=None) -> argparse.Namespace:
    """Parse and validate; errors exit 2 naming the argument and its range, before any process group."""
    ap = argparse.ArgumentParser(prog="python -m preflight.bench.allreduce",
                                 description="one rank of the all-reduce sweep (run it under torchrun or srun)")
    ap.add_argument("--out", required=True, help="results folder (rank 0 writes allreduce-n<N>.json)")
    ap.add_argument("--quick", action="store_true", help=f"sizes up to {QUICK_MAX_BYTES >> 20} MB, 20 iterations")
    ap.add_argument("--min-bytes", type=_nbytes, default=4096, help="smallest message (default 4096)")
    ap.add_argument("--max-bytes", type=_nbytes, default=None, help="largest message (default 256M, 16M with --quick)")
    ap.add_argument("--factor", type=int, choices=(2, 4), default=4, help="size ladder step (default 4)")
    ap.add_argument("--iters", type=_iters, default=None, help="timed iterations per size, 1..10000 (default 50, "
                    f"20 with --quick; big sizes stop after ~{SECONDS_PER_SIZE} s, at least {MIN_ITERS})")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    args = ap.parse_args(argv)
    if args.max_bytes is None:
        args.max_bytes = QUICK_MAX_BYTES if args.quick else 256 * 1024**2
    if args.iters is None:
        args.iters = 20 if args.quick else 50
    esize = DTYPES[args.dtype]
    if args.max_bytes < args.min_bytes:       # each alone was range-checked while parsing
        ap.error(f"argument --max-bytes: {args.max_bytes} is below --min-bytes ({args.min_bytes}); "
                 f"accepted: --min-bytes..{MAX_BYTES_LIMIT} (4 GiB)")
    args.min_bytes, args.max_bytes = args.min_bytes // esize * esize, args.max_bytes // esize * esize
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = message_sizes(args.min_bytes, args.max_bytes, args.factor)
    rec = worker(args.out, sizes, iters=args.iters, dtype=args.dtype)
    if rec is not None:
        df = sweep_frame(rec)
        print(df.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
        fit = rec["results"]["fit"]
        if fit:
            print(f"alpha-beta fit: alpha {fit['alpha_s'] * 1e6:.1f} us, B {fit['bandwidth_GBps']:.3g} GB/s, "
                  f"max rel error {fit['max_rel_error']:.0%}")
        for note in rec["results"]["notes"]:
            print("note:", note)
    return 0


if __name__ == "__main__":
    exit_worker(main)
