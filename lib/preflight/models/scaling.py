"""Amdahl and Gustafson: what the serial part of a step does to scaling.

Strong scaling (fixed total work, Amdahl 1967). A step takes ``T = Ts + Tc``: ``Ts`` is serial (data
waits, synchronisation points, evaluation barriers, logging), ``Tc`` is parallelisable compute. With
``N`` workers and ideal parallelism::

    S(N) = (Ts + Tc) / (Ts + Tc / N)        ceiling  S(inf) = 1 + Tc / Ts

10 % serial caps the speedup at 10x, 5 % at 20x, however many GPUs you buy.

Weak scaling (work grows with N, Gustafson 1988): with serial fraction ``s`` measured on the
parallel machine, ``S(N) = N - s (N - 1)``. Data-parallel training with a fixed per-GPU batch is
closer to this regime, which is why both are shown.
"""
from __future__ import annotations


def _check(ts: float, tc: float, n: float | None = None) -> None:
    if ts < 0 or tc < 0:
        raise ValueError(f"serial and parallel times must be >= 0 (got Ts={ts}, Tc={tc})")
    if ts + tc <= 0:
        raise ValueError("Ts + Tc must be > 0")
    if n is not None and n < 1:
        raise ValueError(f"N must be >= 1 (got {n})")


def amdahl_speedup(ts: float, tc: float, n: float) -> float:
    """Speedup of a step with serial time ``ts`` and parallel time ``tc`` on ``n`` workers."""
    _check(ts, tc, n)
    return (ts + tc) / (ts + tc / n)


def amdahl_ceiling(ts: float, tc: float) -> float:
    """Upper bound of the Amdahl speedup, ``1 + Tc/Ts`` (infinite when nothing is serial)."""
    _check(ts, tc)
    return float("inf") if ts == 0 else 1.0 + tc / ts


def serial_fraction(ts: float, tc: float) -> float:
    _check(ts, tc)
    return ts / (ts + tc)


def gustafson_speedup(serial_frac: float, n: float) -> float:
    """Scaled speedup ``N - s (N - 1)`` for serial fraction ``s`` (0..1) measured at size ``N``."""
    if not 0 <= serial_frac <= 1:
        raise ValueError(f"serial fraction must be in [0, 1] (got {serial_frac})")
    if n < 1:
        raise ValueError(f"N must be >= 1 (got {n})")
    return n - serial_frac * (n - 1)


def speedup_table(ts: float, tc: float, ns: list[int]):
    """Amdahl and Gustafson side by side for a list of worker counts (a pandas DataFrame)."""
    import pandas as pd

    s = serial_fraction(ts, tc)
    return pd.DataFrame({
        "N": ns,
        "amdahl_speedup": [amdahl_speedup(ts, tc, n) for n in ns],
        "gustafson_speedup": [gustafson_speedup(s, n) for n in ns],
        "ideal": [float(n) for n in ns],
    })
