"""HTA reference numbers for every trace folder (one HTA trace collection, one file per rank).

Run with the scratch venv, never the project env:
    /tmp/hta-venv/bin/python tools/hta/hta_numbers.py /work/shared/traces tools/hta/hta-numbers.json
Each HTA analysis is wrapped in try/except; failures are stored as "ExceptionType: message".
Variants per folder: no_ns_rounding (HTA_DISABLE_NS_ROUNDING=1, only where ts has sub-us
fractions) and include_last_profiler_step (=True). See hta-conventions.md.
"""
import datetime
import glob
import gzip
import json
import logging
import math
import os
import platform
import re
import shutil
import sys
import tempfile
import warnings
from collections import Counter
from importlib.metadata import version

import numpy as np
import pandas as pd

warnings.filterwarnings("ignore")
from hta.analyzers.breakdown_analysis import BreakdownAnalysis  # noqa: E402
from hta.configs.config import logger as hta_logger  # noqa: E402
from hta.trace_analysis import TraceAnalysis  # noqa: E402
from hta.utils.utils import get_kernel_type, merge_kernel_intervals  # noqa: E402

hta_logger.setLevel(logging.ERROR)
STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
GPU_CATS = ("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset")


def clean(x):
    """Make numpy/pandas values JSON-safe (NaN/inf -> None)."""
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, np.integer):
        return int(x)
    return (float(x) if math.isfinite(x) else None) if isinstance(x, (float, np.floating)) else x


def records(df):
    if df is None:
        return None
    df = df.reset_index(drop=all(n is None for n in df.index.names))
    df.columns = ["_".join(str(c) for c in col if c != "").strip("_") if isinstance(col, tuple) else str(col)
                  for col in df.columns]
    return clean(df.to_dict("records"))


def err(e):
    return f"{type(e).__name__}: {e}"


def raw_facts(path):
    """Facts read straight from the JSON (not through HTA)."""
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as fh:
        d = json.loads(fh.read())
    ev = d.get("traceEvents", [])
    ts = [e["ts"] for e in ev if "ts" in e]
    n_frac = sum(isinstance(t, float) and t != int(t) for t in ts)
    steps = {}
    for e in ev:
        if STEP_RE.match(str(e.get("name", ""))) and e.get("ph") == "X":
            steps.setdefault(e.get("cat"), []).append(e["name"])
    gpu = [e for e in ev if e.get("cat") in GPU_CATS]
    return {
        "distributedInfo_rank": (d.get("distributedInfo") or {}).get("rank"),
        "displayTimeUnit": d.get("displayTimeUnit"),
        "baseTimeNanoseconds": d.get("baseTimeNanoseconds"),
        "n_events": len(ev),
        "n_ts_float": sum(isinstance(t, float) for t in ts),
        "n_ts_with_sub_us_fraction": n_frac,
        "ts_min": min(ts) if ts else None,
        "ts_unit": "us with ns fractions" if n_frac else "us (integers)",
        "profiler_steps_by_cat": {str(k): v for k, v in steps.items()},
        "n_profiler_step_events": sum(len(v) for v in steps.values()),
        "n_gpu_events_by_cat": dict(Counter(e["cat"] for e in gpu)),
        "sum_gpu_dur_us": sum(e.get("dur", 0) for e in gpu),
    }


def window_facts(ta, rank):
    """What HTA kept for this rank after load_traces() (filtering + ns rounding)."""
    t = ta.t
    st, df = t.symbol_table.get_sym_table(), t.get_trace(rank)
    g = df[df["stream"].ne(-1)]
    steps = df[df["name"].map(lambda i: "ProfilerStep" in st[i])]
    return {
        "iterations_kept": [int(i) for i in t.get_iterations(rank)],
        "profiler_step_rows_kept": sorted(st[i] for i in steps["name"]),
        "n_stream_rows_by_cat": {st[k]: int(v) for k, v in g["cat"].value_counts().items()},
        "n_stream_rows_by_kernel_type": g["name"].map(lambda i: get_kernel_type(st[i])).value_counts().to_dict(),
        "gpu_first_ts_raw_us": clean(g["ts"].min() + t.min_ts) if len(g) else None,
        "gpu_last_end_raw_us": clean((g["ts"] + g["dur"]).max() + t.min_ts) if len(g) else None,
        "n_rows_dur_negative_after_rounding": int((g["dur"] < 0).sum()),
        "n_rows_dur_zero_after_rounding": int((g["dur"] == 0).sum()),
        "n_stream_rows_without_correlation": int((g["correlation"] < 0).sum()),
        "n_stream_rows_launched_outside_steps": int((g["iteration"] < 0).sum()),
        "per_stream_derived": per_stream(g),
    }


def per_stream(g):
    """Not an HTA output: each stream's own span/busy/idle from the rows HTA kept (to show how the
    idle share depends on the stream vs HTA's all-streams-merged temporal breakdown)."""
    out = {}
    for s, k in g.groupby("stream"):
        m = merge_kernel_intervals(k[["ts", "dur"]].copy())
        span, busy = m["end"].max() - m["ts"].min(), (m["end"] - m["ts"]).sum()
        out[str(s)] = clean({"n": len(k), "span_us": span, "busy_union_us": busy,
                             "idle_pct_of_own_span": 100 * (span - busy) / span if span else None})
    return out


def kernel_breakdown_for_rank(ta, rank, all_kernel_df):
    st, df = ta.t.symbol_table.get_sym_table(), ta.t.get_trace(rank)
    g = df[df["stream"].ne(-1)].copy()   # same selection as breakdown_analysis.py:79-83
    g["kernel_type"] = g["name"].map(lambda i: get_kernel_type(st[i]))
    per_type = BreakdownAnalysis._get_gpu_kernel_type_time(  # private helper, this rank alone
        g, ["COMPUTATION", "COMMUNICATION", "MEMORY"])
    mine = all_kernel_df[all_kernel_df["rank"].eq(rank)]
    sums = mine.groupby("kernel_type")["sum (us)"].sum()
    return {
        "union_time_by_category_us": {r["kernel_type"]: r["sum"] for r in records(per_type)},
        "sum_dur_by_type_us": clean(sums.to_dict()),
        "total_sum_dur_us": clean(sums.sum()),
        "communication_kernel_names": sorted(mine[mine["kernel_type"].eq("COMMUNICATION")]["name"]),
        "n_kernel_names_by_type": clean(mine.groupby("kernel_type")["name"].nunique().to_dict()),
    }


def run_all(ta, ranks):
    """All analyses; returns (per_rank dict, folder-level dict)."""
    out = {r: {"rank": r, "errors": {}} for r in ranks}
    folder = {"errors": {}}

    def each(name, fn):
        for r in ranks:
            try:
                out[r][name] = fn(r)
            except Exception as e:
                out[r]["errors"][name] = err(e)

    def once(name, fn):
        try:
            for row in records(fn()):
                out[row.pop("rank")][name] = row
        except Exception as e:
            for r in ranks:
                out[r]["errors"][name] = err(e)

    each("window", lambda r: window_facts(ta, r))
    once("temporal", lambda: ta.get_temporal_breakdown(visualize=False).set_index("rank"))
    once("overlap", lambda: ta.get_comm_comp_overlap(visualize=False).set_index("rank"))
    idle = ta.get_idle_time_breakdown  # ranks must be given: the default is [0] (trace_analysis.py:618-619)
    each("idle_breakdown", lambda r: records(idle(ranks=[r], visualize=False)[0]))
    each("idle_interval_stats", lambda r: records(
        idle(ranks=[r], visualize=False, show_idle_interval_stats=True)[1]))
    try:
        ktype, kall = ta.get_gpu_kernel_breakdown(visualize=False, num_kernels=10**9, duration_ratio=1.0)
        folder["kernel_type_breakdown_all_ranks"] = records(ktype)
        each("kernel_breakdown", lambda r: kernel_breakdown_for_rank(ta, r, kall))
    except Exception as e:
        folder["errors"]["kernel_breakdown"] = err(e)
    each("memory_bw_summary", lambda r: records(ta.get_memory_bw_summary(ranks=[r])))
    each("queue_length_summary", lambda r: records(ta.get_queue_length_summary(ranks=[r])))
    return out, folder


def variant(tmp, env=None, **kw):
    """Reload with other settings; temporal + overlap + window only."""
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        ta = TraceAnalysis(trace_dir=tmp, **kw)
        res = {r: {"window": window_facts(ta, r)} for r in ta.t.get_ranks()}
        for name, fn in (("temporal", ta.get_temporal_breakdown),
                         ("overlap", ta.get_comm_comp_overlap)):
            try:
                for row in records(fn(visualize=False)):
                    res[row.pop("rank")][name] = row
            except Exception as e:
                for r in res:
                    res[r].setdefault("errors", {})[name] = err(e)
        return {str(k): v for k, v in res.items()}
    except Exception as e:
        return {"load_error": err(e)}
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def do_folder(folder):
    files = sorted(glob.glob(os.path.join(folder, "*.json")) + glob.glob(os.path.join(folder, "*.gz")))
    entry = {"folder": os.path.basename(folder.rstrip("/")),
             "files": {os.path.basename(f): raw_facts(f) for f in files}}
    # HTA reads every *.gz / *.json in trace_dir (trace_file.py:32-34); copy so nothing else is picked up.
    tmp = tempfile.mkdtemp(prefix="hta-")
    try:
        for f in files:
            shutil.copy(f, tmp)
        try:
            ta = TraceAnalysis(trace_dir=tmp)
        except Exception as e:
            entry["load_error"] = err(e)
            return entry
        ranks = ta.t.get_ranks()
        entry["hta_rank_to_file"] = {str(r): os.path.basename(ta.t.trace_files[r]) for r in ranks}
        per_rank, entry["folder_level"] = run_all(ta, ranks)
        entry["ranks"] = [per_rank[r] for r in ranks]
        fr = any(v["n_ts_with_sub_us_fraction"] for v in entry["files"].values())
        entry["variants"] = {
            "no_ns_rounding": variant(tmp, {"HTA_DISABLE_NS_ROUNDING": "1"}) if fr else "n/a (integer ts)",
            "include_last_profiler_step": variant(tmp, include_last_profiler_step=True),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


def summary_line(e):
    rows = [(r["rank"], r.get("temporal", {}), r.get("overlap", {}), r.get("kernel_breakdown", {}),
             sorted(r["errors"])) for r in e.get("ranks", [])]
    return "\n".join(
        f"{e['folder']:20} rank {rk:>3} idle% {t.get('idle_time_pctg')} compute% {t.get('compute_time_pctg')} "
        f"non-compute% {t.get('non_compute_time_pctg')} overlap% {o.get('comp_comm_overlap_pctg')} "
        f"comm_us {k.get('sum_dur_by_type_us', {}).get('COMMUNICATION', 0)} kernels_us "
        f"{k.get('total_sum_dur_us')} errors {er}" for rk, t, o, k, er in rows
    ) or f"{e['folder']:20} load error: {e.get('load_error')}"


def main():
    traces_dir, out_path = sys.argv[1:3] if len(sys.argv) == 3 else sys.exit(__doc__)
    result = {
        "generated_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": {"holistictraceanalysis": version("holistictraceanalysis"),
                     "pandas": pd.__version__, "numpy": np.__version__,
                     "python": platform.python_version()},
        "traces_dir": os.path.abspath(traces_dir),
        "notes": "All times in us as HTA reports them (after its ns rounding). idle_breakdown, "
                 "memory_bw_summary and queue_length_summary are per rank; kernel_type_breakdown_all_ranks "
                 "is HTA's public table (summed over the folder's ranks); kernel_breakdown per rank uses "
                 "BreakdownAnalysis._get_gpu_kernel_type_time on that rank alone. window.per_stream_derived "
                 "is computed here from the rows HTA kept, not by HTA.",
        "traces": [],
    }
    for folder in sorted(glob.glob(os.path.join(traces_dir, "*/"))):
        entry = do_folder(folder)
        result["traces"].append(entry)
        print(summary_line(entry), flush=True)
    with open(out_path, "w") as fh:
        fh.write(json.dumps(clean(result), indent=1) + "\n")


if __name__ == "__main__":
    main()
