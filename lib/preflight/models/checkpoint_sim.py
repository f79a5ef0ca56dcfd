"""The checkpoint interval by Monte Carlo: the truth the formulas of ``preflight.models.resilience``
are checked against.

Failures arrive as a Poisson process of mean interval ``M``. Work is done in segments of ``tau``
seconds, each followed by a checkpoint of ``C`` seconds; a failure loses the segment in progress and
costs a restart of ``R`` seconds (a failure during the restart starts it over). The simulation draws
every segment's failures and measures the wall time of the whole run; the waste is the share of it
not spent on useful work. It reproduces Daly's complete model, on common random numbers (one set of
draws for every interval and parameter, so curves are smooth and comparisons are paired). Near its
minimum the waste is flat, so the simulated optimum is a range (``optimal_range_simulated``: the
intervals the simulation cannot tell from the best) with one stable number inside it.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

from preflight.models.resilience import (
    _MAX_EXPONENT,
    _check,
    daly_interval,
    daly_waste,
    first_order_waste,
    young_interval,
)

_EXACT_MAX = 16           # per segment, up to this many failure times are drawn one by one


class _Draws:
    """Every random number a simulation uses for ``(segments, seed)``, independent of tau, C, R and M:
    common random numbers. Each simulated segment (row) keeps its own uniforms whatever the
    parameters, and the inverse CDFs below map them monotonically, so the simulated waste moves
    smoothly with tau (and with C, R, M): neighbouring intervals, and neighbouring slider positions,
    differ by the model's difference, not by fresh noise.

    One stream per kind of draw and per column (``SeedSequence`` spawn keys), each drawn on first use
    and cached read-only: which columns a run needs (up to ``_EXACT_MAX`` failures per row) does not
    change any other number, and memory stays at a few vectors of ``segments`` when failures are rare."""

    KINDS = ("u_work", "v_work", "z_work", "u_rest", "u_rest_n", "z_rest_n", "v_rest", "z_rest")

    def __init__(self, segments: int, seed: int):
        self.n, self.seed, self._cols = int(segments), int(seed), {}

    def col(self, kind: str, j: int = 0) -> np.ndarray:
        key = (kind, j)
        if key not in self._cols:
            rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(self.KINDS.index(kind), j)))
            a = rng.standard_normal(self.n) if kind.startswith("z") else rng.random(self.n)
            if kind.startswith("u"):
                a = 1.0 - a                                   # (0, 1]: a log is finite
            a.setflags(write=False)
            self._cols[key] = a
        return self._cols[key]

    def mat(self, kind: str, rows: np.ndarray, k: int) -> np.ndarray:
        """Columns ``0..k-1`` of ``kind`` for ``rows``: one uniform per failure of a row."""
        return np.stack([self.col(kind, j)[rows] for j in range(k)], axis=1)


@functools.lru_cache(maxsize=4)
def _draws(segments: int, seed: int) -> _Draws:
    return _Draws(segments, seed)


def _geometric(u, x: float) -> np.ndarray:
    """Failures before a stretch of ``x = length / M`` passes without one, by inverse CDF
    (``P(F >= k) = (1 - e^-x)^k``) of the uniforms ``u`` in (0, 1]: monotone in ``x`` for each ``u``."""
    with np.errstate(divide="ignore"):
        return np.floor(np.log(u) / math.log(-math.expm1(-x))) if x > 0 else np.zeros(np.shape(u))


def _lost(counts: np.ndarray, d: _Draws, v: str, z: str, length: float, M: float) -> np.ndarray:
    """Per row, the sum of ``counts`` failure times, each Exp(M) conditioned below ``length``.

    Up to ``_EXACT_MAX`` per row: one by one, by inverse CDF of the row's uniforms (draws ``v``).
    Beyond: a normal (draws ``z``) with the exact mean and variance of the sum, so the total wall time
    keeps its exact mean and variance."""
    x = length / M
    out = np.zeros(counts.shape)
    rows = np.flatnonzero((counts > 0) & (counts <= _EXACT_MAX))
    if rows.size:
        k = counts[rows].astype(np.int64)
        t = -M * np.log1p(d.mat(v, rows, int(k.max())) * math.expm1(-x))
        t[np.arange(t.shape[1])[None, :] >= k[:, None]] = 0.0
        out[rows] = t.sum(axis=1)
    big = counts > _EXACT_MAX
    if big.any():
        if x < 1e-3:                                          # practically uniform on [0, length)
            mean, var = length / 2, length ** 2 / 12
        else:
            q = math.exp(-x)
            mean = M - length / math.expm1(x)
            var = (2 * M * M - q * (length ** 2 + 2 * length * M + 2 * M * M)) / (1 - q) - mean ** 2
        c = counts[big]
        out[big] = np.maximum(0.0, c * mean + np.sqrt(c * max(var, 0.0)) * d.col(z)[big])
    return out


def _restart_failures(fail: np.ndarray, d: _Draws, r: float) -> np.ndarray:
    """Failures during the restarts that follow ``fail`` failures (per row), ``r = R / M``: each restart
    is redone until one passes, so per failure a geometric count. Up to ``_EXACT_MAX`` failures: one
    geometric per failure (exact); beyond: the negative binomial sum by inverse CDF (exact, table of
    its probabilities) when its mean is at most 10, else a normal with its mean and variance."""
    g = np.zeros(fail.shape)
    rows = np.flatnonzero((fail > 0) & (fail <= _EXACT_MAX))
    if rows.size:
        k = fail[rows].astype(np.int64)
        each = _geometric(d.mat("u_rest", rows, int(k.max())), r)
        each[np.arange(each.shape[1])[None, :] >= k[:, None]] = 0.0
        g[rows] = each.sum(axis=1)
    big = np.flatnonzero(fail > _EXACT_MAX)
    if big.size:
        n = fail[big]
        mean = n * math.expm1(r)                              # NB(n, e^-r): n (1 - s) / s
        sd = np.sqrt(mean * math.exp(r))                      # variance n (1 - s) / s^2
        table = mean <= 10
        if table.any():
            nt = n[table]
            kmax = int(np.ceil((mean[table] + 10 * sd[table]).max())) + 10
            ks = np.arange(kmax - 1.0)
            pmf = np.empty((nt.size, kmax))
            pmf[:, 0] = np.exp(-nt * r)
            pmf[:, 1:] = (nt[:, None] + ks) / (ks + 1) * -math.expm1(-r)
            cdf = np.cumsum(np.cumprod(pmf, axis=1), axis=1)
            g[big[table]] = (cdf < d.col("u_rest_n")[big[table], None]).sum(axis=1)
        normal = ~table
        if normal.any():
            g[big[normal]] = np.maximum(0.0, np.rint(mean[normal] + sd[normal] * d.col("z_rest_n")[big[normal]]))
    return g


def _simulate(taus, C: float, R: float, M: float, segments: int, seed: int) -> list[dict]:
    """``simulate_waste`` for each of ``taus``, all on the same random numbers (``_draws``)."""
    if int(segments) != segments or segments < 2:
        raise ValueError(f"segments must be an integer >= 2 (got {segments})")
    d = None
    out = []
    for tau in np.atleast_1d(np.asarray(taus, dtype=float)):
        tau = float(tau)
        if math.isinf(M) or (tau + C) / M > _MAX_EXPONENT or R / M > _MAX_EXPONENT:
            w = C / (tau + C) if math.isinf(M) else 1.0
            out.append({"waste": w, "se": 0.0, "lo": w, "hi": w,
                        "failures_per_segment": 0.0 if math.isinf(M) else math.inf, "segments": int(segments)})
            continue
        d = d or _draws(int(segments), int(seed))
        L = tau + C
        fail = _geometric(d.col("u_work"), L / M)
        wall = L + _lost(fail, d, "v_work", "z_work", L, M)
        fail_restart = np.zeros_like(fail)
        if R > 0:
            fail_restart = _restart_failures(fail, d, R / M)
            wall += fail * R + _lost(fail_restart, d, "v_rest", "z_rest", R, M)
        mean = float(wall.mean())
        waste = 1.0 - tau / mean
        se = tau * float(wall.std(ddof=1)) / (mean * mean * math.sqrt(segments))
        out.append({"waste": waste, "se": se, "lo": waste - 1.96 * se, "hi": waste + 1.96 * se,
                    "failures_per_segment": float((fail + fail_restart).mean()), "segments": int(segments)})
    return out


def simulate_waste(tau: float, C: float, R: float, M: float, *, segments: int = 20000, seed: int = 0) -> dict:
    """Monte Carlo "truth" for the waste, independent of any formula: simulate ``segments`` segments.

    Each segment needs ``tau + C`` of failure-free time. Failures arrive with exponential gaps of mean
    ``M``; one costs the time spent since the segment began plus a restart of ``R``, and a failure
    during the restart starts the restart over. Vectorised per segment: the failure count is drawn
    whole (geometric, by inverse CDF), then the lost times (exponentials conditioned on striking before
    the stretch ends). Returns waste ``1 - tau segments / wall``, its standard error (delta method),
    the 95 % interval ``lo``/``hi`` and failures per segment. Deterministic given ``seed``, and on
    common random numbers (``_Draws``): for one seed, the results at different ``tau`` (or C, R, M)
    share their noise, so they differ smoothly. Past ``e^30`` failures per segment the waste is 1 to
    twelve digits and is returned as 1."""
    _check("tau", tau, 0, strict=True)
    _check("C", C, 0)
    _check("R", R, 0)
    _check("M", M, 0, strict=True, allow_inf=True)
    return _simulate([tau], C, R, M, segments, seed)[0]


def waste_curve(C: float, R: float, M: float, taus=None, segments: int = 20000, seed: int = 0,
                points: int = 29) -> pd.DataFrame:
    """Waste over checkpoint intervals: Daly's model, first order, and the simulation with its 95 %
    interval (columns interval_s, daly, first_order, simulated, simulated_lo, simulated_hi,
    simulated_se, simulated_failures: failures the simulation drew there, in all). Default
    intervals: ``points`` log-spaced from 0.05x to 20x Young's, plus Young's
    and Daly's. Every interval uses the same random numbers (common random numbers: the simulated
    curve is smooth, and ``simulate_waste`` with the same seed and segments gives the same value at
    any interval of the curve). ``first_order`` is the raw formula: it can exceed 1 (invalid).
    ``attrs`` holds ``C``, ``R``, ``M`` (a chart reads the model's waste at any interval from them)."""
    _check("C", C, 0)
    _check("R", R, 0)
    _check("M", M, 0, strict=True, allow_inf=True)
    if taus is None:
        young = young_interval(C, M)
        if not 0 < young < math.inf:
            raise ValueError(f"waste_curve needs C > 0 and a finite M to place the intervals, or taus "
                             f"(got C={C}, M={M})")
        taus = np.unique(np.r_[young * np.logspace(math.log10(0.05), math.log10(20), points),
                               young, daly_interval(C, M)])
    taus = np.asarray(taus, dtype=float)
    _check("tau", taus, 0, strict=True)
    sims = _simulate(taus, C, R, M, segments, seed)
    curve = pd.DataFrame({"interval_s": taus, "daly": np.atleast_1d(daly_waste(taus, C, R, M)),
                         "first_order": np.atleast_1d(first_order_waste(taus, C, R, M)),
                         "simulated": [s["waste"] for s in sims], "simulated_lo": [s["lo"] for s in sims],
                         "simulated_hi": [s["hi"] for s in sims], "simulated_se": [s["se"] for s in sims],
                          "simulated_failures": [s["failures_per_segment"] * s["segments"] for s in sims]})
    curve.attrs.update(C=float(C), R=float(R), M=float(M), segments=int(segments), seed=int(seed))
    return curve


def optimal_range_simulated(curve: pd.DataFrame) -> tuple[float, float, float]:
    """``(lo, hi, best)``: the intervals whose simulated waste cannot be told from the minimum, and
    one stable interval inside them.

    Near its minimum the waste is flat (at C << M, twice Young's interval costs only 25 % more than
    the optimum), so the lowest simulated point wanders with the noise: read the range, not the point.
    The range is the contiguous run of intervals around the lowest point whose 95 % interval overlaps
    the lowest point's (``simulated_lo <= simulated_hi`` at the minimum), its ends interpolated in log
    interval where ``simulated_lo`` crosses that level (so they move smoothly with the inputs). With
    common random numbers the differences between intervals are more precise than each point, so the
    range is conservative: everything in it is as good as the simulation can tell.

    ``best`` minimises a smoothed curve: a least-squares parabola in log interval through the points of
    the range (at least five), its vertex kept inside ``[lo, hi]``; where the parabola has no minimum
    (a flat or one-sided curve), the geometric middle ``sqrt(lo hi)``. A fit through several points
    moves little when one of them moves, unlike the argmin."""
    t = curve["interval_s"].to_numpy(dtype=float)
    w = curve["simulated"].to_numpy(dtype=float)
    lo_ci, hi_ci = curve["simulated_lo"].to_numpy(dtype=float), curve["simulated_hi"].to_numpy(dtype=float)
    order = np.argsort(t)
    t, w, lo_ci, hi_ci = t[order], w[order], lo_ci[order], hi_ci[order]
    i = int(np.argmin(w))
    level = hi_ci[i]
    ok = lo_ci <= level
    a = i
    while a > 0 and ok[a - 1]:
        a -= 1
    b = i
    while b < t.size - 1 and ok[b + 1]:
        b += 1

    def cross(j_in: int, j_out: int) -> float:            # where lo_ci reaches the level, in log t
        y0, y1 = lo_ci[j_in] - level, lo_ci[j_out] - level
        f = 0.0 if y1 <= y0 else min(1.0, max(0.0, -y0 / (y1 - y0)))
        return float(math.exp(math.log(t[j_in]) + f * (math.log(t[j_out]) - math.log(t[j_in]))))

    lo = cross(a, a - 1) if a > 0 else float(t[a])
    hi = cross(b, b + 1) if b < t.size - 1 else float(t[b])
    while b - a + 1 < min(5, t.size):                      # at least five points for the fit
        a, b = (a - 1, b) if a > 0 and (b == t.size - 1 or i - a <= b - i) else (a, b + 1)
    u = np.log(t[a:b + 1] / t[i])
    best = math.sqrt(lo * hi)
    if np.ptp(w[a:b + 1]) > 0:
        c2, c1, _ = np.polyfit(u, w[a:b + 1], 2)
        if c2 > 0:
            best = float(t[i] * math.exp(-c1 / (2 * c2)))
    return lo, hi, float(min(max(best, lo), hi))


MIN_FAILURES = 10     # simulated failures near the optimum needed to say where it is (fewer: se unreliable)


def simulation_resolves_optimum(curve: pd.DataFrame, min_failures: float = MIN_FAILURES) -> bool:
    """Whether the simulation drew enough failures (``min_failures``, in all, at the simulated
    optimum) to say anything about where the optimum is. With rare failures (MTBF of years against
    intervals of hours) a few thousand segments see none: the simulated waste is then only
    ``C / (tau + C)``, which falls with tau, and its "optimum" is the longest interval tried. The
    formulas still hold; the simulation just cannot check them there (more segments would)."""
    if "simulated_failures" not in curve:
        return True
    best = optimal_range_simulated(curve)[2]
    t = curve["interval_s"].to_numpy(dtype=float)
    near = curve["simulated_failures"].to_numpy(dtype=float)[np.argsort(t)]
    return bool(np.interp(math.log(best), np.log(np.sort(t)), near) >= min_failures)


def optimal_interval_simulated(curve: pd.DataFrame) -> float:
    """The simulated optimum as one stable number: ``optimal_range_simulated(curve)[2]`` (the minimum
    of a smoothed curve, not the noisy argmin; the range around it is the honest answer)."""
    return optimal_range_simulated(curve)[2]
