"""Read a per-op straggler trace: one Parquet file of operations and the job's meta YAML.

The format is the one ByteDance-Seed's StragglerAnalysis publishes (arXiv 2505.05713, Apache-2.0;
``../shared/stragglers/README.md``): one row per operation a worker ran, with the worker's data-parallel
rank ``dp_rank``, pipeline stage ``stage`` and global ``rank``, the training ``step``, the operation type
``optype`` (``forward-compute``, ``backward-send``, ``grads-reduce-scatter``...), its ``start_ts`` and
``duration`` in seconds, and ``seq_id``, the order of the ops of that type in that step on that worker.
One worker per tensor-parallel group is recorded: its TP peers run in lock step with it.

The meta file names the layout: ``dp_size``, ``pp_size``, ``tp_size``, ``dsp_size``, ``vpp_size`` and
``world_size`` (= dp x pp x tp x dsp). Everything is checked before any number is computed: a missing
column, a wrong type, a negative duration, a worker missing an op, a layout that disagrees with itself
or with the trace each raise :class:`StragglerTraceError` naming the file, the field and the accepted
range (the CLI exits 2 on it).

What comes out is a :class:`OpTrace`: the ops one worker of each stage runs in a step (the *template*,
the same in every step and every data-parallel replica) and, for each, its start and duration as arrays
``[op, step, dp_rank]`` - the shape the replay in :mod:`preflight.diagnose.stragglers_whatif` works on.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

# "compute" is the GPU compute between two collectives of a profiler trace (stragglers_from_trace), which
# does not say forward from backward; a Parquet per-op trace names the two and may not use it
COMPUTE = ("forward-compute", "backward-compute", "compute")
P2P = ("forward-send", "forward-recv", "backward-send", "backward-recv")
DP_COMM = ("params-all-gather", "grads-reduce-scatter")
OPTYPES = ("forward-compute", "backward-compute", *P2P, *DP_COMM, "layernorm-grads-all-reduce",
           "embedding-grads-all-reduce", "optimizer-clip-main-grad", "optimizer", "gc")
# column -> the kind of values it must hold; mc, mb_id, gmc are optional (-1 where they do not apply)
REQUIRED = {"dp_rank": "integer", "stage": "integer", "rank": "integer", "step": "integer", "optype": "string",
            "start_ts": "float", "duration": "float", "seq_id": "integer"}
OPTIONAL = {"mc": "integer", "mb_id": "integer", "gmc": "integer"}
META_SIZES = ("dp_size", "pp_size", "tp_size", "dsp_size", "vpp_size", "world_size")
MAX_DURATION_S = 86_400.0      # one op of more than a day is a unit error (ms or us written as s)


class StragglerTraceError(ValueError):
    """Bad input: the message names the file, the field and what is accepted."""


@dataclass(frozen=True)
class Meta:
    trial_name: str
    run_id: int
    dp_size: int
    pp_size: int
    tp_size: int
    dsp_size: int
    vpp_size: int
    world_size: int
    file: str = ""


@dataclass
class OpTrace:
    """The trace as arrays. ``ops[n] = (stage, optype, seq_id)``; ``start[n, s, d]`` and ``dur[n, s, d]``
    are op n's start (seconds from the step's first op) and duration in step ``steps[s]`` on the
    worker of data-parallel rank d; ``rank[d, stage]`` is that worker's global rank."""
    path: Path
    meta: Meta
    ops: list[tuple[int, str, int]]
    steps: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    rank: np.ndarray
    # False: the ops of one type on a stage are one kind of work (Megatron's microbatches), judged together;
    # True: each op is its own work (a profiler trace's compute between two collectives differs from the next)
    typical_per_op: bool = False

    @property
    def optype(self) -> np.ndarray:
        return np.array([o[1] for o in self.ops])

    @property
    def stage(self) -> np.ndarray:
        return np.array([o[0] for o in self.ops])


def find_inputs(folder: str | Path) -> tuple[Path, Path]:
    """The folder's one ``*.parquet`` trace and one ``meta*.yaml`` (or ``.yml``), else the reason."""
    folder = Path(folder)
    if not folder.is_dir():
        raise StragglerTraceError(f"{folder}: not a folder")
    parquets = sorted(folder.glob("*.parquet"))
    metas = sorted([*folder.glob("meta*.yaml"), *folder.glob("meta*.yml")])
    if len(parquets) != 1:
        raise StragglerTraceError(f"{folder}: expected one per-op trace (*.parquet), found {len(parquets)}"
                                  + (f": {', '.join(p.name for p in parquets)}" if parquets else ""))
    if len(metas) != 1:
        raise StragglerTraceError(f"{folder}: expected one job meta file (meta*.yaml) beside {parquets[0].name}, "
                                  f"found {len(metas)}; it names dp_size, pp_size, tp_size, dsp_size, vpp_size, "
                                  "world_size")
    return parquets[0], metas[0]


def read_meta(path: str | Path) -> Meta:
    import yaml

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise StragglerTraceError(f"{path}: not a readable YAML file ({type(err).__name__})") from None
    if not isinstance(raw, dict):
        raise StragglerTraceError(f"{path}: expected a mapping of trial_name, run_id, {', '.join(META_SIZES)}")
    unknown = sorted(set(raw) - {"trial_name", "run_id", *META_SIZES})
    if unknown:
        raise StragglerTraceError(f"{path}: unknown field {unknown[0]!r}; accepted: trial_name, run_id, "
                                  f"{', '.join(META_SIZES)}")
    vals = {}
    for key in META_SIZES:
        v = raw.get(key, None if key in ("dp_size", "pp_size", "world_size") else 1)
        if v is None:
            raise StragglerTraceError(f"{path}: field {key!r} is missing; a whole number >= 1")
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1_000_000:
            raise StragglerTraceError(f"{path}: field {key!r} = {v!r}; accepted: a whole number, 1 to 1,000,000")
        vals[key] = v
    run_id = raw.get("run_id", 0)
    if isinstance(run_id, bool) or not isinstance(run_id, int) or run_id < 0:
        raise StragglerTraceError(f"{path}: field 'run_id' = {run_id!r}; accepted: a whole number >= 0")
    name = str(raw.get("trial_name", path.stem))
    product = vals["dp_size"] * vals["pp_size"] * vals["tp_size"] * vals["dsp_size"]
    if product != vals["world_size"]:
        raise StragglerTraceError(f"{path}: world_size = {vals['world_size']} but dp_size x pp_size x tp_size x "
                                  f"dsp_size = {vals['dp_size']} x {vals['pp_size']} x {vals['tp_size']} x "
                                  f"{vals['dsp_size']} = {product}; they must agree")
    if vals["vpp_size"] != 1:
        raise StragglerTraceError(f"{path}: vpp_size = {vals['vpp_size']}: interleaved (virtual) pipeline stages are "
                                  "not modelled; accepted: 1")
    return Meta(trial_name=name, run_id=run_id, **vals, file=path.name)


def _columns(path: Path):
    """The Parquet table as numpy columns, each checked for presence and kind."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as err:
        raise StragglerTraceError(f"{path}: not a readable Parquet file ({type(err).__name__}: {err})") from None
    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        raise StragglerTraceError(f"{path}: missing column{'s' * (len(missing) > 1)} {', '.join(missing)}; a per-op "
                                  f"trace has {', '.join(REQUIRED)} (and optionally {', '.join(OPTIONAL)})")
    if table.num_rows == 0:
        raise StragglerTraceError(f"{path}: no rows; a per-op trace has one row per operation")
    cols = {}
    for name, kind in {**REQUIRED, **{k: v for k, v in OPTIONAL.items() if k in table.column_names}}.items():
        col = table.column(name)
        if col.null_count:
            raise StragglerTraceError(f"{path}: column {name!r} has {col.null_count} empty values; every row needs one")
        t = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
        ok = {"integer": pa.types.is_integer(t), "float": pa.types.is_floating(t) or pa.types.is_integer(t),
              "string": pa.types.is_string(t) or pa.types.is_large_string(t)}[kind]
        if not ok:
            raise StragglerTraceError(f"{path}: column {name!r} is {col.type}; expected {kind} values")
        if kind == "string":
            cols[name] = np.asarray(col.cast(pa.string()) if pa.types.is_dictionary(col.type) else col, dtype=object)
        else:
            cols[name] = np.asarray(col.to_numpy(), dtype=np.float64 if kind == "float" else np.int64)
    return cols


def _check_range(path: Path, name: str, values: np.ndarray, low: float, high: float, what: str) -> None:
    bad = ~np.isfinite(values) | (values < low) | (values > high) if values.dtype.kind == "f" else \
        (values < low) | (values > high)
    if bad.any():
        i, n = int(np.flatnonzero(bad)[0]), int(bad.sum())
        raise StragglerTraceError(f"{path}: column {name!r}: {n} value{'s' * (n > 1)} out of range "
                                  f"(row {i}: {values[i]}); accepted: {low:g} to {high:g} {what}")


def read_trace(path: str | Path, meta: Meta) -> OpTrace:
    """Read and check the Parquet per-op trace of the job ``meta`` describes."""
    path = Path(path)
    c = _columns(path)
    _check_range(path, "duration", c["duration"], 0.0, MAX_DURATION_S, "seconds")
    _check_range(path, "start_ts", c["start_ts"], -1e9, 1e12, "seconds")
    _check_range(path, "dp_rank", c["dp_rank"], 0, meta.dp_size - 1, f"(dp_size = {meta.dp_size} in {meta.file})")
    _check_range(path, "stage", c["stage"], 0, meta.pp_size - 1, f"(pp_size = {meta.pp_size} in {meta.file})")
    _check_range(path, "rank", c["rank"], 0, meta.world_size - 1, f"(world_size = {meta.world_size} in {meta.file})")
    _check_range(path, "seq_id", c["seq_id"], 0, 1e9, "(order of the op among its type in the step)")
    _check_range(path, "step", c["step"], 0, 1e15, "")
    unknown = sorted(set(c["optype"]) - set(OPTYPES))
    if "separate-grads-all-reduce" in unknown:
        raise StragglerTraceError(f"{path}: column 'optype': separate-grads-all-reduce (gradient reduction overlapped "
                                  "with the backward) is not modelled; accepted: " + ", ".join(OPTYPES))
    if unknown:
        raise StragglerTraceError(f"{path}: column 'optype': unknown operation type {unknown[0]!r}; accepted: "
                                  f"{', '.join(OPTYPES)}")
    if "mc" in c and (c["mc"] > 0).any():
        raise StragglerTraceError(f"{path}: column 'mc' (model chunk) goes up to {int(c['mc'].max())}: interleaved "
                                  "pipeline stages are not modelled; accepted: -1 or 0")
    for name, size in (("dp_rank", meta.dp_size), ("stage", meta.pp_size)):
        seen = np.unique(c[name])
        if len(seen) != size:
            raise StragglerTraceError(f"{path}: column {name!r} holds {len(seen)} distinct values but {meta.file} says "
                                      f"{'dp_size' if name == 'dp_rank' else 'pp_size'} = {size}; the what-if needs "
                                      "one worker of every (dp rank, stage)")
    # one global rank per worker, the same in every step
    worker = c["dp_rank"] * meta.pp_size + c["stage"]
    pairs = np.unique(np.stack([worker, c["rank"]]), axis=1)
    if pairs.shape[1] != meta.dp_size * meta.pp_size:
        raise StragglerTraceError(f"{path}: column 'rank' is not one global rank per (dp_rank, stage) worker")
    rank = np.empty((meta.dp_size, meta.pp_size), dtype=np.int64)
    rank[pairs[0] // meta.pp_size, pairs[0] % meta.pp_size] = pairs[1]

    # the template: the ops (stage, optype, seq_id) one worker of each stage runs in a step
    keys = np.array([f"{s}\x00{t}\x00{q}" for s, t, q in zip(c["stage"], c["optype"], c["seq_id"])], dtype=object)
    uniq, node = np.unique(keys, return_inverse=True)
    ops = [(int(s), t, int(q)) for s, t, q in (k.split("\x00") for k in uniq)]
    steps, step_ix = np.unique(c["step"], return_inverse=True)
    n_op, n_step, n_dp = len(ops), len(steps), meta.dp_size
    count = np.zeros((n_op, n_step, n_dp), dtype=np.int64)
    np.add.at(count, (node, step_ix, c["dp_rank"]), 1)
    if (count != 1).any():
        n, s, d = (int(x[0]) for x in np.nonzero(count != 1))
        st, t, q = ops[n]
        how = "is missing" if count[n, s, d] == 0 else f"appears {int(count[n, s, d])} times"
        raise StragglerTraceError(f"{path}: step {int(steps[s])}, dp_rank {d}, stage {st}: op {t} #{q} {how}; "
                                  "every worker of a stage must run the same ops once "
                                  "per step (a truncated trace, or two jobs in one file)")
    start = np.empty((n_op, n_step, n_dp))
    dur = np.empty((n_op, n_step, n_dp))
    start[node, step_ix, c["dp_rank"]] = c["start_ts"]
    dur[node, step_ix, c["dp_rank"]] = c["duration"]
    start -= start.min(axis=(0, 2), keepdims=True)          # seconds from the step's first op
    return OpTrace(path=path, meta=meta, ops=ops, steps=steps, start=start, dur=dur, rank=rank)


def load(folder: str | Path) -> OpTrace:
    """The folder's meta file and trace, both checked."""
    trace, meta = find_inputs(folder)
    return read_trace(trace, read_meta(meta))
