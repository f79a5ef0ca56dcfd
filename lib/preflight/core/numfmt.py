"""Numbers for people: one home for the formatting the report, the comparison, the charts and the
sliders share.

A number on a page has two jobs: be right, and be read at a glance. The rules used throughout:

- **significant digits, not decimals**: ``0.426`` and ``78.1`` and ``1,875`` each carry three digits
  of information; ``{:.2f}`` would print ``0.43``, ``78.10`` and ``1875.00``;
- **thousands separators** from 100 or 1000 up, never scientific notation for ordinary sizes;
  short scientific notation (``1.0e-4``) only for very small probabilities;
- **the unit that fits**: a duration in s / min / h / d / years, memory in GB (decimal, as GPU
  datasheets and ``nvidia-smi`` state it) or GiB (binary, as allocators and the memory plan count);
- **shares as percentages**, with ``<0.001%`` and ``>99.9%`` at the ends rather than a rounded
  ``0%`` or ``100%`` that would read as "never" or "certain".

:func:`fmt_value`, :func:`fmt_delta` and :func:`fmt_rel` write a finding's value in its ``unit``
(report and ``preflight compare``); the rest are the building blocks.
"""
from __future__ import annotations

__all__ = ["GiB", "duration", "fmt_delta", "fmt_finding", "fmt_rel", "fmt_value", "gb", "gib", "num", "pct",
           "factor", "percent", "plural", "sci", "seconds"]

GiB = 2 ** 30
_YEAR_S = 365.25 * 86400


# --- plain numbers ------------------------------------------------------------------------------------

def sci(p: float, digits: int = 2) -> str:
    """``1.0e-4``, ``3.78e-3``: short scientific notation (no padded exponent, no ``+``), ``digits``
    significant digits (trailing zeros dropped above two)."""
    if p == 0:
        return "0"
    m, e = f"{p:.{digits - 1}e}".split("e")
    if digits > 2:
        m = m.rstrip("0")
        m = m + "0" if m.endswith(".") else m
    return f"{m}e{int(e)}"


def num(x: float) -> str:
    """``1,875``, ``78.1``, ``0.426``: three significant digits below 100, whole numbers with commas
    above, short scientific notation only below 0.001; ``—`` for NaN, ``unbounded`` for infinity."""
    if x != x:
        return "—"
    if x == float("inf"):
        return "unbounded"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return "0" if x == 0 else f"{x:.3g}" if abs(x) >= 1e-3 else sci(x)


def factor(x: float) -> str:
    """A speedup or ratio as a factor, by :func:`num`: ``9.89x``, ``921x``, ``1,843x``; ``unbounded``
    for infinity (an Amdahl ceiling with no serial part)."""
    return "unbounded" if x == float("inf") else f"{num(x)}x"


def plural(n: float, word: str) -> str:
    """``1 node``, ``16 nodes``, ``2,048 GPUs``, ``4 micro-batches``: a count and its noun, never "node(s)"."""
    return f"{n:,} {word}" + ("" if n == 1 else "es" if word.endswith(("ch", "sh", "s", "x")) else "s")


def pct(x: float) -> str:
    """A share or probability in percent, three significant digits: ``0.426%``, ``9.52%``, ``<0.001%``,
    ``>99.9%``."""
    if x != x:
        return "—"
    if x <= 0:
        return "0%"
    if x >= 1:
        return "100%"
    if x > 0.999:
        return ">99.9%"
    return "<0.001%" if x < 1e-5 else f"{100 * x:#.3g}".rstrip(".") + "%"      # 0.270%: digits kept


# --- quantities with a unit ---------------------------------------------------------------------------

def duration(seconds: float) -> str:
    """``45 s``, ``53.7 min``, ``7.91 h``, ``78.1 d``, ``2,740 years``: the unit that fits (up to 48 h
    in hours, as walltimes are stated), the number by :func:`num`."""
    if seconds != seconds:
        return "—"
    if seconds == float("inf"):
        return "unbounded"
    for limit, div, unit in ((120, 1, "s"), (7200, 60, "min"), (172801, 3600, "h"), (2 * _YEAR_S, 86400, "d")):
        if seconds < limit:
            return f"{num(seconds / div)} {unit}"
    return f"{num(seconds / _YEAR_S)} years"


def gb(nbytes: float) -> str:
    """Bytes in decimal gigabytes by :func:`num`: ``55.9 GB``, ``14,000 GB`` (1 GB = 10^9 bytes)."""
    return f"{num(nbytes / 1e9)} GB"


def gib(nbytes: float) -> str:
    """Bytes in binary gibibytes, one decimal: ``74.5 GiB`` (1 GiB = 2^30 bytes, 7.4 % more than a GB)."""
    return f"{nbytes / GiB:,.1f} GiB"


# --- a finding's value in its unit --------------------------------------------------------------------

def percent(x: float) -> str:
    """Any fraction in percent, signed: ``68.4%``, ``-5.41%``, ``0.00316%``, ``150%`` (:func:`pct` for a
    share between 0 and 1, three significant digits otherwise)."""
    if x != x:
        return "—"
    if 0 < abs(x) < 1:
        return ("-" if x < 0 else "") + pct(abs(x))
    return f"{num(100 * x)}%"


def seconds(s: float) -> str:
    """A duration in seconds as thresholds state it, with the unit that reads, from 10 min up:
    ``2.26 s``, ``45 s``, ``5,000 s (83.3 min)``, ``28,420 s (7.89 h)``."""
    return f"{num(s)} s" if s != s or abs(s) < 600 else f"{num(s)} s ({duration(abs(s))})"


def fmt_value(value, unit: str, binary: bool = False) -> str:
    """A finding's number for people: 12.5%, 3.2x, 56 GB, 5,000 s (83.3 min), yes/no; ``n/a`` when null.

    ``unit`` is the finding's: ``fraction`` prints as a percentage, ``probability`` too, ``x`` as a
    factor, ``s`` by :func:`seconds`, ``h`` with days from 48 h up, ``bytes`` in GB (data moved or
    stored, as datasheets count) or, with ``binary``, in GiB (MiB below 1 GiB: memory, as allocators
    and the memory plan count; :func:`fmt_finding` decides), ``bool`` as yes/no, ``ratio`` as a bare
    number; any other unit is printed after the number
    (:func:`num`: three significant digits, commas from 1,000 up, no scientific notation above 0.001)."""
    if value is None:
        return "n/a"
    if unit in ("fraction", "probability"):
        return percent(value)
    if unit == "x":
        return factor(value)
    if unit == "s":
        return seconds(value)
    if unit == "h" and abs(value) >= 48:
        return f"{num(value)} h ({duration(abs(value) * 3600)})"
    if unit == "bytes":
        if binary:
            return gib(value) if abs(value) >= GiB else f"{num(value / 2 ** 20)} MiB"
        return gb(value)
    if unit == "bool":
        return "yes" if value else "no"
    if unit == "ratio":                 # a plain quotient (plan / capacity, async / sync stall)
        return num(value)
    return f"{num(value)} {unit}".strip()


def fmt_finding(finding: dict) -> str:
    """A finding's (a findings.json entry's) value in its unit, written as its threshold is: bytes of
    memory (an id naming ``memory``, e.g. ``baseline/memory_per_gpu``) in GiB, as the memory plan and its
    chart show them; a ratio judged in percent ("plan / GPU memory: pass <= 90%") in percent (574%)."""
    if finding["unit"] == "ratio" and finding["value"] is not None and "%" in (finding.get("threshold") or ""):
        return percent(finding["value"])
    return fmt_value(finding["value"], finding["unit"], binary=is_memory(finding["id"]))


def is_memory(finding_id: str) -> bool:
    """A finding of memory (its name says ``memory``): its bytes print in GiB, as the memory plan's."""
    return "memory" in finding_id.split("/")[-1]


def fmt_delta(delta: float | None, unit: str, binary: bool = False) -> str:
    """A signed change in the finding's unit: +1.2 GB, -3.5 pp (fractions: percentage points, not
    percent), +0.4x, -120 s; empty for booleans and unknowns."""
    if delta is None or unit == "bool":
        return ""
    if delta == 0:
        return "0"
    if unit == "fraction":
        return f"{delta * 100:+.1f} pp"
    return ("+" if delta > 0 else "-") + fmt_value(abs(delta), unit, binary)


def fmt_rel(rel: float | None) -> str:
    """A relative change as a signed percentage: ``+25.0%``; ``0`` for none, empty when unknown."""
    return "" if rel is None else "0" if rel == 0 else f"{rel:+.1%}"
