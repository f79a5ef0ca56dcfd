"""Staged data-parallel scaling, measured with real DDP: 1 -> 2 processes here, 1 -> 8 -> 64 -> 512 GPUs
on a cluster.

Weak scaling: every rank trains the reference model (``preflight.harness.reference``) on its own
synthetic batch of fixed size, wrapped in ``DistributedDataParallel``, so a step on ``N`` ranks does
``N`` times the work of a step on one. Ideally the step time stays flat; what it grows by is the
price of scale (gradient all-reduce not hidden behind backward, synchronisation, stragglers)::

    efficiency(N) = step_s(1) / step_s(N)        speedup(N) = throughput(N) / throughput(1)

Three ways in:

- the worker, one process per rank, started by ``torchrun`` (or by ``srun``, one task per GPU)::

      torchrun --nproc_per_node=N -m preflight.bench.scaling --out DIR [--steps K] [--quick]

  Rank 0 writes one record (method "scaling") with every rank's median step time.
- ``run_stages((1, 2), out=DIR)``: runs the worker under ``torchrun --standalone`` for each N on this
  machine, one after the other, and returns the table.
- ``load_stage_records(DIR)``: the same table from records produced elsewhere, e.g. by
  ``slurm/scaling_stages.sbatch`` at 8 / 64 / 512 GPUs; ``measured_efficiencies`` feeds them to
  ``preflight.models.extrapolate.scaling_curve(measured=...)``.

On a CPU the "devices" are processes (gloo backend), one core each: with 2 cores, N=1 and N=2 are
the only stages whose timings mean much (field notes). Joining the process group, the rank limit of
this machine and the torchrun command come from ``preflight.harness.launch``, shared by every
multi-process bench.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import warnings
from pathlib import Path

from preflight.core.records import Method
from preflight.harness.launch import exit_worker, init_distributed, max_processes, run_torchrun, torchrun_cmd

METHOD = Method("scaling", 1, required=("world_size", "step_s", "samples_per_s"), runs_on="ranks")
WARMUP_STEPS = 3


# --- the worker ---------------------------------------------------------------------------------------

def _time_ddp_steps(cfg, device, rank: int, steps: int):
    """Train the reference model under DDP for warm-up + ``steps`` steps; (Timing, parameter count).

    Kept in its own function so that DDP, its gradient reducer (which holds the process group and
    its pending work) and the optimizer are freed when it returns, before the group is destroyed:
    teardown then runs in the order it was built.
    """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from preflight.core.timing import time_fn
    from preflight.harness import reference as ref

    model = ref.make_model(cfg, device, seed=0)          # same initial weights on every rank
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1000 + rank)     # each rank its own data
    batches = [ref.synthetic_batch(cfg, device, gen) for _ in range(4)]   # on the device already
    state = {"i": 0}

    def step():
        tokens, targets = batches[state["i"] % len(batches)]
        state["i"] += 1
        opt.zero_grad(set_to_none=True)
        with ref.autocast(cfg, device):
            loss = ddp(tokens, targets)
        loss.backward()           # DDP all-reduces gradient buckets during backward
        opt.step()

    timing = time_fn(step, device=device, warmup=WARMUP_STEPS, repeats=steps)
    return timing, ref.count_params(model)


def worker(out: str | os.PathLike, steps: int = 30, quick: bool = False) -> dict | None:
    """One rank of the measurement. Returns the record on rank 0 (after writing it), None elsewhere.

    Device: ``cuda:LOCAL_RANK`` with NCCL where there are GPUs, else the CPU with gloo. Each rank times
    its own steps (median after warm-up); the medians are all-gathered and rank 0 writes the record.
    """
    import gc

    import torch
    import torch.distributed as dist

    from preflight.core.records import save_record
    from preflight.harness import reference as ref

    de, device = init_distributed()
    backend = dist.get_backend()
    try:
        cfg = ref.config_for(device, tiny=quick)
        t, n_params = _time_ddp_steps(cfg, device, de["rank"], steps)
        gc.collect()
        mine = torch.tensor([t.median_s, t.p10_s, t.p90_s], dtype=torch.float64, device=device)
        every = [torch.zeros_like(mine) for _ in range(de["world_size"])]
        dist.all_gather(every, mine)
        per_rank = [[float(v) for v in x.cpu()] for x in every]
        record = None
        if de["rank"] == 0:
            step_s = max(r[0] for r in per_rank)      # the slowest rank sets the pace
            samples = de["world_size"] * cfg.batch
            results = {
                "world_size": de["world_size"], "nodes": de["nodes"], "launcher": de["launcher"],
                "processes_per_node": de["local_world_size"], "backend": backend,
                "device_kind": device.type, "unit": "GPUs (nccl)" if device.type == "cuda" else "processes (CPU, gloo)",
                "omp_num_threads": torch.get_num_threads(), "per_rank_batch": cfg.batch,
                "step_s": step_s, "step_s_per_rank": [r[0] for r in per_rank],
                "step_s_p10_p90_per_rank": [r[1:] for r in per_rank],
                "samples_per_s": samples / step_s, "tokens_per_s": samples * cfg.seq_len / step_s,
                "steps_timed": steps, "warmup_steps": WARMUP_STEPS,
            }
            params = {"model": cfg.as_dict(), "steps": steps, "quick": quick, "params": n_params,
                      "weak_scaling": True}
            record = METHOD.record(params, results)
            save_record(record, out, name=f"n{de['world_size']}")
        dist.barrier()                # field notes: without it ~1 run in 8 aborted at exit
        return record
    finally:
        dist.destroy_process_group()


# --- stages on this machine ---------------------------------------------------------------------------

def run_stages(ns=(1, 2), out: str | os.PathLike | None = None, quick: bool = False,
               steps: int | None = None, timeout: float = 300.0):
    """Run the worker under ``torchrun --standalone --nproc_per_node=N`` for each N; the table.

    N above the machine's limit (CPU: usable cores; GPU: device count) is dropped with a warning and
    a note in ``df.attrs["notes"]``. On the CPU every stage runs with ``OMP_NUM_THREADS=1``, N=1
    included: torchrun sets 1 thread per process for N>1, and giving the lone N=1 process both cores
    instead would measure the op library's thread scaling on top of data parallelism (and
    efficiency(2) would come out low for a reason unrelated to DDP). With one thread per process
    every rank does identical work on its own core, so the efficiency is the cost of DDP itself.
    Each stage gets its own temp dir (TMPDIR) for torchrun's files; ``--standalone`` picks a free port.
    """
    limit, unit = max_processes()
    keep = [n for n in ns if 1 <= n <= limit]
    notes = []
    if len(keep) < len(ns):
        msg = (f"stages {[n for n in ns if n not in keep]} skipped: this machine allows at most "
               f"{limit} {unit}")
        warnings.warn(msg, stacklevel=2)
        notes.append(msg)
    if steps is None:
        steps = 15 if quick else 30
    with tempfile.TemporaryDirectory(prefix="preflight-scaling-") as tmp:
        out_dir = Path(out) if out is not None else Path(tmp) / "records"
        paths = []
        for n in keep:
            stage_tmp = Path(tmp) / f"n{n}"
            stage_tmp.mkdir()
            env = dict(os.environ, TMPDIR=str(stage_tmp))
            if unit.startswith("processes"):
                env["OMP_NUM_THREADS"] = "1"
            cmd = torchrun_cmd(n, "preflight.bench.scaling", "--out", out_dir, "--steps", steps)
            if quick:
                cmd.append("--quick")
            run_torchrun(cmd, env, timeout)
            paths.append(out_dir / f"{METHOD.name}-n{n}.json")
        records = [dict(json.loads(p.read_text()), _path=str(p)) for p in paths]
    df = stages_frame(records)
    df.attrs["notes"] = notes + df.attrs.get("notes", [])
    df.attrs["records"] = records
    return df


def measure_stages(out: str | os.PathLike | None = None, quick: bool = False) -> list[dict]:
    """Method ``scaling`` as chapter 1 runs it here: the stages 1 and 2 under torchrun, their records
    (the ones ``torchrun ... -m preflight.bench.scaling --out DIR`` writes on a cluster). Empty,
    with the reason printed, where fewer than 2 ranks fit (one GPU: NCCL takes one rank per GPU)."""
    n_max, unit = max_processes()
    if n_max < 2:
        print(f"Only {n_max} {unit} here: a scaling stage needs 2. Measure the stages on your cluster "
              "(slurm/scaling_stages.sbatch) and pass them with --results.")
        return []
    df = run_stages(out=out, quick=quick)
    for note in df.attrs["notes"]:
        print("note:", note)
    return df.attrs["records"]


# --- records -> table --------------------------------------------------------------------------------

COLUMNS = ["world_size", "nodes", "unit", "device", "step_s", "throughput", "tokens_per_s", "speedup",
           "efficiency", "date", "source"]


def stages_frame(records: list[dict]):
    """One row per world size (the latest record of each), efficiency and speedup vs the smallest.

    Columns: world_size, nodes, unit ("GPUs (nccl)" or "processes (CPU, gloo)"), device, step_s
    (slowest rank's median), throughput (samples/s, all ranks), tokens_per_s, speedup
    (throughput / throughput at the reference size), efficiency (step_s(ref) / step_s(N): weak
    scaling), date, source (record file). The reference is N=1 when present, else the smallest N
    (then ``attrs["notes"]`` says so: efficiencies are relative to it, not to one device).
    """
    import pandas as pd

    latest: dict[int, dict] = {}
    for r in sorted(records, key=lambda r: r.get("date", "")):
        if r.get("method") == METHOD.name:
            latest[int(r["results"]["world_size"])] = r
    rows = []
    for n, r in sorted(latest.items()):
        res = r["results"]
        rows.append({"world_size": n, "nodes": res.get("nodes"), "unit": res.get("unit"),
                     "device": (r.get("device") or {}).get("name"), "step_s": res["step_s"],
                     "throughput": res["samples_per_s"], "tokens_per_s": res.get("tokens_per_s"),
                     "date": r.get("date"), "source": r.get("_path")})
    df = pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("speedup", "efficiency")])
    notes = []
    if len(df):
        ref = df.iloc[0]
        df["speedup"] = df["throughput"] / ref["throughput"]
        df["efficiency"] = ref["step_s"] / df["step_s"]
        if ref["world_size"] != 1:
            notes.append(f"no 1-{ref['unit']} record: efficiency is relative to {ref['world_size']}")
        if df["unit"].nunique() > 1 or df["device"].nunique() > 1:
            notes.append("records from different devices are mixed: compare with care")
    else:
        df["speedup"], df["efficiency"] = [], []
    df = df[COLUMNS]
    df.attrs["notes"] = notes
    return df


def load_stage_records(folder: str | os.PathLike):
    """The stage table (``stages_frame``) from every scaling record under ``folder``."""
    from preflight.core.records import load_records

    return stages_frame(load_records(folder, METHOD.name))


def measured_efficiencies(df) -> dict[int, float]:
    """``{world_size: efficiency}`` for ``scaling_curve(measured=...)``."""
    return {int(n): float(e) for n, e in zip(df["world_size"], df["efficiency"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preflight.bench.scaling",
                                 description="one rank of the DDP weak-scaling measurement (run it "
                                             "under torchrun or srun), or --stages to launch them")
    ap.add_argument("--out", required=True, help="results folder (rank 0 writes scaling-n<N>.json)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps after warm-up (default 30, "
                                                            "15 with --quick)")
    ap.add_argument("--quick", action="store_true", help="tiny model (tests, smoke runs)")
    ap.add_argument("--stages", default=None, help="comma-separated N: launch torchrun for each "
                                                   "(e.g. 1,2) instead of being a worker")
    args = ap.parse_args(argv)
    if args.stages:
        df = run_stages(tuple(int(n) for n in args.stages.split(",")), out=args.out, quick=args.quick,
                        steps=args.steps)
        print(df.drop(columns=["source"]).to_string(index=False))
        for note in df.attrs.get("notes", []):
            print("note:", note)
        return 0
    steps = args.steps if args.steps is not None else (15 if args.quick else 30)
    rec = worker(args.out, steps=steps, quick=args.quick)
    if rec is not None:
        r = rec["results"]
        print(f"scaling: world_size {r['world_size']}, step {r['step_s'] * 1e3:.1f} ms, "
              f"{r['samples_per_s']:.1f} samples/s")
    return 0


if __name__ == "__main__":
    exit_worker(main)
