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

``--decoders``: instead, the JSON decoders a reader could stand on, on one trace of ``--events``
events: Python's ``json.loads`` of the whole file (the baseline), ``orjson.loads`` and
``msgspec.json.decode`` of the whole file (each when installed), and the reader itself
(``read_trace``) on the standard library's decoder with its filtering hook (what it uses), and on
``msgspec`` decoding each event into a small record with ``ts``, ``dur`` and ``args`` left as raw
JSON slices, decoded only for the events the reader keeps (``_MSGSPEC_READER`` below: the candidate,
kept here, not in the library, until it wins). Each in a fresh process, ``--repeats`` times,
interleaved (the box is shared): the median wall time of the decode, and the process's peak resident
memory above the file's decompressed bytes.
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


_DECODE = """
import gzip, json, resource, sys, time
sys.path.insert(0, sys.argv[3])
which, path = sys.argv[1], sys.argv[2]
raw = gzip.decompress(open(path, "rb").read())
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
if which == "json.loads":
    x = json.loads(raw.decode())
elif which == "orjson.loads":
    import orjson
    x = orjson.loads(raw)
elif which == "msgspec.json.decode":
    import msgspec
    x = msgspec.json.decode(raw)
else:
    from preflight.diagnose import trace_file
    if which == "reader (msgspec, raw slices)":
        exec(sys.argv[4], {"trace_file": trace_file})
    x = trace_file.read_trace(path, raw)
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "peak_above_bytes_MB": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024}))
"""


_MSGSPEC_READER = """
import gzip
from typing import Any
import msgspec
U = msgspec.UNSET

class Ev(msgspec.Struct, gc=False):
    ph: Any = U
    cat: Any = U
    name: Any = U
    pid: Any = U
    tid: Any = U
    ts: msgspec.Raw | msgspec.UnsetType = U
    dur: msgspec.Raw | msgspec.UnsetType = U
    args: msgspec.Raw | msgspec.UnsetType = U

class Top(msgspec.Struct):
    traceEvents: list[Ev]
    distributedInfo: Any = None
    deviceProperties: Any = None

def load_json(path, raw=None):
    raw = gzip.decompress(raw) if raw[:2] == b"\\x1f\\x8b" else raw
    top = msgspec.json.Decoder(Top, float_hook=trace_file._num).decode(raw)
    value = msgspec.json.Decoder(float_hook=trace_file._num).decode
    evs = []
    for e in top.traceEvents:
        if e.ph != "X" or trace_file._kind(e.cat, e.name) is None:
            evs.append(None if e.ph is not U else {})
            continue
        d = {k: getattr(e, k) for k in ("ph", "cat", "name", "pid", "tid") if getattr(e, k) is not U}
        d |= {k: value(getattr(e, k)) for k in ("ts", "dur", "args") if getattr(e, k) is not U}
        evs.append(trace_file._hook(d))
    return {"traceEvents": evs, "distributedInfo": top.distributedInfo, "deviceProperties": top.deviceProperties}

trace_file.load_json = load_json
"""


def decoders(events: int, repeats: int, tmp: Path) -> dict:
    """The decoders side by side (see the module's docstring)."""
    import importlib.util
    import statistics

    path = tmp / "rank0.pt.trace.json.gz"
    write_trace(path, events, 0, 1)
    names = ["json.loads", "orjson.loads", "msgspec.json.decode", "reader (json + filtering hook)",
             "reader (msgspec, raw slices)"]
    have = {n: importlib.util.find_spec(n.split(".")[0].split(" ")[0]) is not None for n in names[:3]}
    have |= {names[3]: True, names[4]: importlib.util.find_spec("msgspec") is not None}
    runs: dict[str, list] = {n: [] for n in names if have[n]}
    for _ in range(repeats):
        for n in runs:
            r = subprocess.run([sys.executable, "-c", _DECODE, n, str(path), str(REPO / "lib"), _MSGSPEC_READER],
                               capture_output=True, text=True, check=True)
            runs[n].append(json.loads(r.stdout))
    base = statistics.median(x["wall_s"] for x in runs["json.loads"])
    out = {"events": events, "repeats": repeats, "not_installed": [n for n in names if not have[n]], "results": {}}
    for n, xs in runs.items():
        wall = statistics.median(x["wall_s"] for x in xs)
        out["results"][n] = {"wall_s_median": round(wall, 3), "wall_s_all": [round(x["wall_s"], 3) for x in xs],
                             "peak_above_bytes_MB": round(max(x["peak_above_bytes_MB"] for x in xs), 1),
                             "time_vs_json_loads": round(wall / base, 2)}
    mem = out["results"]["json.loads"]["peak_above_bytes_MB"]
    for v in out["results"].values():
        v["memory_vs_json_loads"] = round(v["peak_above_bytes_MB"] / mem, 2) if mem else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--rank-events", type=int, default=50_000)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--decoders", action="store_true", help="measure the JSON decoders instead (see above)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "lib"))
    from preflight.core.device import cpu_info, versions

    rec = {"method": "trace_reader_bench", "method_version": 1,
           "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "machine": cpu_info().as_dict(),
           "cores": os.cpu_count(), "python": platform.python_version(), "versions": versions()}
    if args.decoders:
        rec["method"] = "trace_decoder_bench"
        with tempfile.TemporaryDirectory() as tmp:
            rec["decoders"] = decoders(args.events, args.repeats, Path(tmp))
        text = json.dumps(rec, indent=1)
        print(text)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "trace_decoder_bench.json").write_text(text)
        return 0
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
