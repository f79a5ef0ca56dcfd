"""Benchmark of the trace reader (a script, not a timed test): how long, and how much memory, one big
trace and a many-rank job take on this machine.

    python tools/bench_traces.py [--events 2000000] [--ranks 64] [--rank-events 50000] [--out DIR]

1. One trace of ``--events`` events, shaped like a real GPU rank's (per step: CPU ops with shapes,
   runtime launches, kernels on two streams, flow arrows, memcpys, NCCL kernels), gzip-compressed;
   read by ``python -m preflight traces`` in a fresh process: wall time and the process's peak
   resident memory (``ru_maxrss`` of the child), then again from the cache.
2. ``--ranks`` ranks of ``--rank-events`` events each, read the same way (one process per file,
   as many at once as there are cores), then again from the cache.

Prints one JSON record (method ``trace_reader_bench``, with the machine, versions and date) and writes
it to ``--out`` if given. The README quotes its figures.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE = 1_712_195_495_000_000


def _events(n: int, rank: int, seed: int = 0):
    """About ``n`` events: steps of 1,000 events each (ProfilerStep, CPU ops, launches, kernels, flows)."""
    rnd = random.Random(seed + rank)
    t, corr, k = 0.0, 0, 0
    step = 0
    while k < n:
        step += 1
        t0 = t
        yield {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": BASE + t0, "dur": 20_000.0,
               "pid": 1, "tid": 1}
        k += 1
        for _ in range(125):                      # 8 events per op: cpu op, runtime, kernel, 2 flows, 3 child ops
            corr += 1
            d = rnd.uniform(5, 60)
            name = rnd.choice(("aten::mm", "aten::add", "aten::layer_norm", "aten::gelu"))
            args = {"External id": corr, "Input Dims": [[512, 1024], [1024, 1024]], "Input type": ["c10::BFloat16"] * 2}
            yield {"ph": "X", "cat": "cpu_op", "name": name, "ts": BASE + t, "dur": 12.5, "pid": 1, "tid": 1, "args": args}
            for c in range(3):
                yield {"ph": "X", "cat": "cpu_op", "name": f"aten::child{c}", "ts": BASE + t + c, "dur": 1.0,
                       "pid": 1, "tid": 1, "args": {"External id": corr}}
            yield {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": BASE + t + 4, "dur": 4.2,
                   "pid": 1, "tid": 1, "args": {"correlation": corr}}
            comm = corr % 40 == 0
            kname = "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)" if comm else \
                ("sm90_xmma_gemm_bf16bf16_bf16f32" if name == "aten::mm" else "vectorized_elementwise_kernel<4>")
            kargs = {"stream": 20 if comm else 7, "correlation": corr, "device": 0}
            if comm:
                kargs |= {"Collective name": "allreduce", "In msg nelems": 1 << 22, "dtype": "BFloat16",
                          "Group size": 64, "Process Group Name": "0"}
            yield {"ph": "X", "cat": "kernel", "name": kname, "ts": BASE + t + 9.123, "dur": d, "pid": 0, "tid": 7,
                   "args": kargs}
            yield {"ph": "s", "cat": "ac2g", "id": corr, "name": "ac2g", "ts": BASE + t + 4, "pid": 1, "tid": 1}
            yield {"ph": "f", "cat": "ac2g", "id": corr, "name": "ac2g", "ts": BASE + t + 9.123, "pid": 0, "tid": 7,
                   "bp": "e"}
            t += 160.0
            k += 8
        t = t0 + 20_000.0 + 50.0


def write_trace(path: Path, n: int, rank: int, world: int) -> int:
    """Write one gzip trace; returns its size in bytes."""
    head = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world}}
    with gzip.open(path, "wt", compresslevel=1) as f:
        f.write(json.dumps(head)[:-1] + ', "traceEvents": [')
        for i, e in enumerate(_events(n, rank)):
            f.write(("," if i else "") + json.dumps(e))
        f.write("]}")
    return path.stat().st_size


_CHILD = """
import json, resource, runpy, sys
sys.argv = ["preflight", "traces", sys.argv[1], "--json"]
try:
    runpy.run_module("preflight", run_name="__main__")
except SystemExit:
    pass
peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.stderr.write("PEAK_KB %d\\n" % peak)
"""


def run_traces(folder: Path, cache: Path) -> dict:
    """``python -m preflight traces FOLDER --json`` in a child: wall seconds, and the peak resident memory
    of that process or of the largest of the reader processes it started."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", _CHILD, str(folder)], capture_output=True, text=True,
                       env={**os.environ, "PREFLIGHT_CACHE": str(cache)})
    wall = time.perf_counter() - t0
    peak = [int(ln.split()[1]) for ln in r.stderr.splitlines() if ln.startswith("PEAK_KB")]
    if not peak:
        raise SystemExit(r.stderr[-3000:])
    return {"wall_s": round(wall, 2), "peak_rss_MB": round(peak[0] / 1024, 1), "ranks": len(json.loads(r.stdout)["ranks"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--rank-events", type=int, default=50_000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "lib"))
    from preflight.core.device import cpu_info, versions

    rec = {"method": "trace_reader_bench", "method_version": 1,
           "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "machine": cpu_info().as_dict(),
           "cores": os.cpu_count(), "python": platform.python_version(), "versions": versions()}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        big = tmp / "big"
        big.mkdir()
        t0 = time.perf_counter()
        size = write_trace(big / "rank0.pt.trace.json.gz", args.events, 0, 1)
        rec["big"] = {"events": args.events, "gz_MB": round(size / 1e6, 1), "write_s": round(time.perf_counter() - t0, 1)}
        with gzip.open(big / "rank0.pt.trace.json.gz", "rb") as f:
            rec["big"]["json_MB"] = round(sum(len(c) for c in iter(lambda: f.read(1 << 24), b"")) / 1e6, 1)
        rec["big"]["first"] = run_traces(big, tmp / "cache")
        rec["big"]["cached"] = run_traces(big, tmp / "cache")
        many = tmp / "many"
        many.mkdir()
        write_trace(many / "rank0.pt.trace.json.gz", args.rank_events, 0, args.ranks)
        for r in range(1, args.ranks):           # the same events under each rank (the reader does not know)
            raw = gzip.decompress((many / "rank0.pt.trace.json.gz").read_bytes()).decode()
            raw = raw.replace('"rank": 0,', f'"rank": {r},', 1)
            (many / f"rank{r}.pt.trace.json.gz").write_bytes(gzip.compress(raw.encode(), compresslevel=1))
        rec["many"] = {"ranks": args.ranks, "events_per_rank": args.rank_events,
                       "first": run_traces(many, tmp / "cache2"), "cached": run_traces(many, tmp / "cache2")}
    text = json.dumps(rec, indent=1)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "trace_reader_bench.json").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
