"""What a trace event must look like before any verdict reads it.

A trace is user input: a hand-edited file, a truncated copy, another tool's export. Every event the
reader keeps (``preflight.diagnose.trace_file``) is checked here, field by field, and either turned
into the few plain values the verdicts read or rejected with the field and the reason:

- times (``ts``, ``dur``) are finite, non-negative numbers of microseconds small enough to be held
  in integer nanoseconds (``ts`` < 4e15 us, about the year 2096; ``dur`` < 1e15 us);
- names are strings; ``args`` is an object; ids (``correlation``, ``stream``) are integers in
  0..2^63 - 1 (a ROCm stream may be written ``"0x0"``);
- a communication kernel's sizes (``bytes``, ``In msg nelems``...) are integers in 0..2^62, its
  ``Group size`` 1..10^6, a send/recv's ``Dst Rank`` / ``Src Rank`` / ``Global rank start`` / ``stride``
  -1..10^6 (-1: PyTorch does not say);
- an op's ``Input Dims`` is a list of shapes, each a list of integers in 0..2^31 (a scalar is ``[]``).

A rejected event is *counted*, never dropped in silence: the reader keeps, per field, how many and
the first one's index, for the trace-quality table, and refuses the file when too many of its GPU
events are malformed for the verdicts to stand (``trace_file.MALFORMED_LIMIT``).
``distributedInfo`` and ``deviceProperties`` are checked here too; a bad one refuses the file: the
rank and world size decide which file is which rank.
"""
from __future__ import annotations

import math
from decimal import Decimal

MAX_TS_NS = 4 * 10**18             # ts in integer ns, about year 2096 as an epoch time
MAX_DUR_NS = 10**18
MAX_ID = 2**63 - 1
MAX_BYTES = 2**62
MAX_DIM = 2**31
MAX_WORLD = 10**6


class Bad(Exception):
    """One field of one event is malformed: ``field`` and ``why`` (the accepted range)."""

    def __init__(self, field: str, why: str):
        super().__init__(f"{field}: {why}")
        self.field, self.why = field, why


def ns(v, field: str, limit: int) -> int:
    """A time in microseconds -> integer nanoseconds, or :class:`Bad`."""
    t = type(v)
    if t is float and 0 <= v <= limit // 1000:           # the common case first: a plain number in range
        return int(round(v * 1000))
    if isinstance(v, bool) or not isinstance(v, (int, float, Decimal)):
        raise Bad(field, f"{type(v).__name__} {_short(v)}, not a number of microseconds")
    if isinstance(v, int):
        out = v * 1000
    elif isinstance(v, Decimal):
        if not v.is_finite():
            raise Bad(field, f"{v}, not a finite number")
        if abs(v) > limit:                           # before scaling: a 1e999999 exponent stays cheap
            raise Bad(field, f"{_short(v)} us: out of range (0 to {limit // 1000} us)")
        out = int((v * 1000).to_integral_value())
    else:
        if not math.isfinite(v):
            raise Bad(field, f"{v}, not a finite number")
        if abs(v) > limit:
            raise Bad(field, f"{_short(v)} us: out of range (0 to {limit // 1000} us)")
        out = int(round(v * 1000))
    if out < 0 or out > limit:
        raise Bad(field, f"{_short(v)} us: out of range (0 to {limit // 1000} us)")
    return out


def integer(v, field: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise Bad(field, f"{type(v).__name__} {_short(v)}, not an integer")
    if not lo <= v <= hi:
        raise Bad(field, f"{_short(v)}: out of range ({lo} to {hi})")
    return v


def stream_id(v, field: str) -> int:
    """An int, or ROCm's hex string ``"0x1f"``."""
    if isinstance(v, str) and v.lower().startswith("0x"):
        try:
            return integer(int(v, 16), field, 0, MAX_ID)
        except ValueError:
            raise Bad(field, f"{_short(v)}, not a hexadecimal stream id") from None
    return integer(v, field, -1, MAX_ID)


def text(v, field: str) -> str:
    if not isinstance(v, str):
        raise Bad(field, f"{type(v).__name__} {_short(v)}, not a string")
    return v


def thread(v) -> int | str:
    """A tid/pid as a key: an int or a string, else -1 (only compared for equality)."""
    return v if isinstance(v, (str, int)) and not isinstance(v, bool) else -1


def args_of(e: dict) -> dict:
    a = e.get("args")
    if a is None:
        return {}
    if not isinstance(a, dict):
        raise Bad("args", f"{type(a).__name__}, not an object")
    return a


_SIZE_ARGS = ("bytes", "In msg nelems", "Out msg nelems")
_TEXT_ARGS = ("Collective name", "dtype")


def gpu_args(a: dict, keep: tuple) -> dict:
    """The communication arguments of a GPU event, checked (see the module's docstring)."""
    out = {}
    for k in keep:
        if k not in a or a[k] is None:
            continue
        v = a[k]
        if k in _SIZE_ARGS:
            out[k] = integer(v, f"args.{k}", 0, MAX_BYTES)
        elif k == "Group size":
            out[k] = integer(v, f"args.{k}", 1, MAX_WORLD)
        elif k in ("Dst Rank", "Src Rank", "Global rank start", "Global rank stride"):   # -1: not said
            out[k] = integer(v, f"args.{k}", -1, MAX_WORLD)
        elif k in ("Seq", "Sequence number"):
            out[k] = integer(v, f"args.{k}", 0, MAX_ID)
        elif k == "Process Group Name":
            out[k] = str(integer(v, f"args.{k}", 0, MAX_ID)) if isinstance(v, int) else text(v, f"args.{k}")
        elif k in _TEXT_ARGS:
            out[k] = text(v, f"args.{k}")
    return out


def dims(v, field: str = "args.Input Dims") -> list:
    """``Input Dims``: a list of shapes (lists of integers in 0..2^31); a scalar's shape is ``[]``."""
    if not isinstance(v, list):
        raise Bad(field, f"{type(v).__name__}, not a list of shapes")
    out = []
    for i, shape in enumerate(v):
        if not isinstance(shape, list):
            raise Bad(f"{field}[{i}]", f"{type(shape).__name__} {_short(shape)}, not a shape (a list of integers)")
        out.append([integer(x, f"{field}[{i}]", 0, MAX_DIM) for x in shape])
    return out


def str_list(v, field: str) -> list:
    if not isinstance(v, list):
        raise Bad(field, f"{type(v).__name__}, not a list")
    return [x if isinstance(x, str) else str(x)[:80] for x in v]


def step_number(name: str) -> int:
    try:
        return integer(int(name.split("#", 1)[1]), "name", 0, MAX_ID)
    except ValueError:
        raise Bad("name", f"{_short(name)}: a ProfilerStep#N with N an integer") from None


def distributed(info, path) -> dict:
    """``distributedInfo`` checked: 0 <= rank < world_size <= 10^6, process groups as lists of ranks.
    Raises :class:`Bad` naming the field."""
    if info is None:
        return {}
    if not isinstance(info, dict):
        raise Bad("distributedInfo", f"{type(info).__name__}, not an object")
    world = info.get("world_size")
    if world is not None:
        world = integer(world, "distributedInfo.world_size", 1, MAX_WORLD)
    rank = info.get("rank")
    if rank is not None:
        rank = integer(rank, "distributedInfo.rank", 0, (world or MAX_WORLD) - 1)
    groups = {}
    pgs = info.get("pg_config")
    if pgs is not None and not isinstance(pgs, list):
        raise Bad("distributedInfo.pg_config", f"{type(pgs).__name__}, not a list of process groups")
    for i, pg in enumerate(pgs or []):
        f = f"distributedInfo.pg_config[{i}]"
        if not isinstance(pg, dict):
            raise Bad(f, f"{type(pg).__name__}, not an object")
        if "pg_name" not in pg:
            continue
        name = pg["pg_name"]
        if not isinstance(name, (str, int)) or isinstance(name, bool):
            raise Bad(f"{f}.pg_name", f"{type(name).__name__}, not a string")
        size = pg.get("pg_size")
        if size is not None:
            size = integer(size, f"{f}.pg_size", 1, world or MAX_WORLD)
        ranks = pg.get("ranks")
        if ranks is not None and not isinstance(ranks, list):
            raise Bad(f"{f}.ranks", f"{type(ranks).__name__} {_short(ranks)}, not a list of ranks")
        head = [integer(r, f"{f}.ranks", 0, (world or MAX_WORLD) - 1) for r in (ranks or [])[:8]]
        desc = pg.get("pg_desc")
        groups[str(name)] = {"size": size, "desc": desc if isinstance(desc, str) else None, "ranks_head": head}
    backend, nccl = info.get("backend"), info.get("nccl_version")
    return {"rank": rank, "world_size": world, "groups": groups,
            "backend": backend if isinstance(backend, str) else None,
            "nccl_version": nccl if isinstance(nccl, str) else None}


def devices(props) -> list[str]:
    if props is None:
        return []
    if not isinstance(props, list):
        raise Bad("deviceProperties", f"{type(props).__name__}, not a list")
    return sorted({p["name"] for p in props if isinstance(p, dict) and isinstance(p.get("name"), str) and p["name"]})


def _short(v) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."

