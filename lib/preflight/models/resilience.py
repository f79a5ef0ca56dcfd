"""Fault tolerance: how often a large job is interrupted, and how often it should checkpoint.

Failure is normal at scale (pitfalls brief, section 5). Model each node as failing independently with
probability ``p`` per day. The job survives a day only if all ``N`` nodes do::

    P(>= 1 failure in d days) = 1 - (1 - p)^(N d)          p = 1e-4, N = 1000: 9.5 % per day

The same ``p`` as a Poisson rate per node is ``lambda = -ln(1 - p)`` per day (~ p for small p); the
system fails at ``N lambda`` per day, so its mean time between failures is ``MTBF = 24 h / (N lambda)``
(240 h above). Public reference: the Llama 3 405B pre-training (Dubey et al. 2024, "The Llama 3 Herd
of Models", arXiv 2407.21783, section 3.3.4) saw 419 unexpected interruptions in 54 days on 16,384
H100 GPUs (2,048 nodes of 8): one every 3.1 hours.

A checkpoint costs ``C`` seconds of writing; a failure costs the work since the last checkpoint plus
``R`` seconds of restart. Checkpoint every ``tau`` seconds of work. Young's first-order optimum
(Young 1974, "A first order approximation to the optimum checkpoint interval", CACM 17(9)) is
``sqrt(2 C M)``; Daly's higher-order one (Daly 2006, "A higher order estimate of the optimum
checkpoint interval for restart dumps", FGCS 22(3)) corrects it when ``C`` is not small against
``M``. ``daly_waste`` is Daly's complete model with exponential failures, which may strike during
work, checkpoint writes and restarts alike; it is exact for that process, and ``simulate_waste``
reproduces it by Monte Carlo. Times are in seconds unless a name says ``_h`` (hours) or ``_day``.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

LLAMA3 = {"interruptions": 419, "days": 54, "gpus": 16384, "gpus_per_node": 8}
FIELD = {"p_node_day": 1e-4, "nodes": 1000}
_MAX_EXPONENT = 30.0      # e^30 ~ 1e13 failures per segment: the waste is 1 to twelve digits


def _check_prob(name: str, value) -> np.ndarray:
    a = np.asarray(value, dtype=float)
    if not np.all((a >= 0) & (a <= 1)):
        raise ValueError(f"{name} must be a probability in [0, 1] (got {value})")
    return a


def _check(name: str, value, low: float, *, strict: bool = False, allow_inf: bool = False) -> np.ndarray:
    a = np.asarray(value, dtype=float)
    ok = (a > low if strict else a >= low) & (np.isfinite(a) | allow_inf)
    if not np.all(ok):
        rng = f"{'>' if strict else '>='} {low:g}" + (" (inf allowed)" if allow_inf else " and finite")
        raise ValueError(f"{name} must be {rng} (got {value})")
    return a


def _out(a):
    return float(a) if np.ndim(a) == 0 else a


# -- how often ---------------------------------------------------------------------------------------

def failure_prob(p_node_day, nodes, days=1.0):
    """Probability of at least one node failure: ``1 - (1 - p)^(nodes days)``. Array-friendly.

    1e-4 per node-day on 1000 nodes: 9.52 % per day, 94.3 % over a 30-day run."""
    p = _check_prob("p_node_day", p_node_day)
    exposure = _check("nodes", nodes, 1) * _check("days", days, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = -np.expm1(exposure * np.log1p(-p))       # stable for tiny p; p = 1 gives 1
    return _out(np.where(exposure == 0, 0.0, out))


def node_rate_per_day(p_node_day):
    """Poisson rate with the same daily failure probability: ``-ln(1 - p)`` (p = 1: inf)."""
    p = _check_prob("p_node_day", p_node_day)
    with np.errstate(divide="ignore"):
        return _out(-np.log1p(-p))


def system_mtbf_h(p_node_day, nodes):
    """Mean time between failures of the whole job (hours): ``24 / (nodes lambda)``; inf when p = 0."""
    rate = node_rate_per_day(p_node_day) * _check("nodes", nodes, 1)
    with np.errstate(divide="ignore"):
        return _out(24.0 / np.asarray(rate, dtype=float))


def run_failures(p_node_day, nodes, days):
    """Expected failures during a run: ``nodes lambda days`` (several per day at Llama 3 scale)."""
    d = _check("days", days, 0)
    with np.errstate(invalid="ignore"):
        out = node_rate_per_day(p_node_day) * _check("nodes", nodes, 1) * d
    return _out(np.where(d == 0, 0.0, out))


def mtbf_from_interruptions(count: float, days: float) -> float:
    """Observed MTBF (hours) from a count of interruptions over ``days``: Llama 3, 54 d x 24 / 419 = 3.09 h."""
    _check("count", count, 0)
    _check("days", days, 0, strict=True)
    return math.inf if count == 0 else days * 24.0 / count


REFERENCE_COLUMNS = ("case", "nodes", "per-node daily failure probability", "failures per day",
                     "P(failure per day)", "MTBF (h)", "source")


def reference_points() -> pd.DataFrame:
    """The two public reference points, one row each, with the columns of ``REFERENCE_COLUMNS``
    (headers a reader understands: the frame is shown as it is).

    Llama 3's implied per-node probability counts every unexpected interruption as a node failure
    (about 78 % were attributed to confirmed or suspected hardware issues, the rest to software,
    network and the like), so it describes the whole system, not only the hardware."""
    n3 = LLAMA3["gpus"] // LLAMA3["gpus_per_node"]
    per_day3 = LLAMA3["interruptions"] / LLAMA3["days"]
    p3 = -math.expm1(-per_day3 / n3)        # the daily probability whose Poisson rate gives that count
    rows = [
        ("field report", FIELD["nodes"], FIELD["p_node_day"],
         run_failures(FIELD["p_node_day"], FIELD["nodes"], 1.0), failure_prob(FIELD["p_node_day"], FIELD["nodes"]),
         system_mtbf_h(FIELD["p_node_day"], FIELD["nodes"]),
         "field report (Preflight domain brief): 1e-4 failures per node-day, 1,000 nodes"),
        ("Llama 3 405B", n3, p3, per_day3, failure_prob(p3, n3),
         mtbf_from_interruptions(LLAMA3["interruptions"], LLAMA3["days"]),
         "Dubey et al. 2024, \"The Llama 3 Herd of Models\" (arXiv 2407.21783), section 3.3.4: "
         "419 unexpected interruptions in 54 days on 16,384 H100 GPUs"),
    ]
    return pd.DataFrame(rows, columns=list(REFERENCE_COLUMNS))


# -- how often to checkpoint -------------------------------------------------------------------------

def young_interval(C: float, M: float) -> float:
    """Young's optimum compute time between checkpoints: ``sqrt(2 C M)``. C = 60 s, M = 24 h: 3,220 s.

    It balances the checkpoint cost per unit of work, ``C / tau``, against the expected loss, half an
    interval per failure, ``tau / (2 M)``; the sum is smallest where both are equal."""
    _check("C", C, 0)
    _check("M", M, 0, strict=True, allow_inf=True)
    return math.sqrt(2.0 * C * M)


def daly_interval(C: float, M: float) -> float:
    """Daly's higher-order optimum: ``sqrt(2CM) [1 + s/3 + s^2/9] - C`` with ``s = sqrt(C / 2M)``, for
    C < 2M; ``M`` otherwise. Equal to ``2 M s (1 - s/3)^2``: always positive, at least Young - C, and
    Young's value when C << M. Daly 2006, eq. 37; the optimum does not depend on R."""
    _check("C", C, 0)
    _check("M", M, 0, strict=True, allow_inf=True)
    if C >= 2.0 * M:
        return float(M)
    s = math.sqrt(C / (2.0 * M))
    return math.sqrt(2.0 * C * M) * (1.0 + s / 3.0 + s * s / 9.0) - C


def daly_waste(tau, C: float, R: float, M: float):
    """Expected share of wall time not spent on useful work, Daly's complete exponential model.

    One segment is ``tau`` of work plus ``C`` of writing, ``tau + C`` that must pass without a failure.
    A failure restarts it after ``R`` of restart, which must itself pass without a failure. With
    failures at rate ``1/M`` the expected wall time per unit of work is exactly::

        T_w / T_s = M e^(R/M) (e^((tau + C)/M) - 1) / tau,      waste = 1 - T_s / T_w

    (no failures, M = inf: waste = C / (tau + C)). Array-friendly in ``tau``."""
    t = _check("tau", tau, 0, strict=True)
    _check("C", C, 0)
    _check("R", R, 0)
    _check("M", M, 0, strict=True, allow_inf=True)
    if math.isinf(M):
        return _out(C / (t + C))
    with np.errstate(over="ignore"):
        ratio = M * math.exp(min(R / M, 700.0)) * np.expm1((t + C) / M) / t
    return _out(1.0 - 1.0 / ratio)


def first_order_waste(tau, C: float, R: float, M: float):
    """Young's first-order overhead: ``C/tau + (tau + C)/(2M) + R/M`` (checkpoint cost, half a segment
    and a restart lost per failure). Per unit of useful work, not of wall time, and without failures
    during recovery: fine when the result is a few percent, wrong when C is not small against M (it
    exceeds 1 where the true waste is still below 1). Array-friendly in ``tau``."""
    t = _check("tau", tau, 0, strict=True)
    _check("C", C, 0)
    _check("R", R, 0)
    _check("M", M, 0, strict=True, allow_inf=True)
    return _out(C / t + (t + C) / (2.0 * M) + R / M)


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
    simulated_se, simulated_failures: failures the simulation drew there, in all). Default intervals: ``points`` log-spaced from 0.05x to 20x Young's, plus Young's
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


def restart_share(R: float, M: float) -> float:
    """Share of wall time spent restarting, Daly's exponential model: ``1 - e^(-R/M)`` (about R/M).

    Per failure one restart episode of mean ``M (e^(R/M) - 1)``; failures per unit of wall time follow
    from ``daly_waste``. It does not depend on the interval, and it is why R moves the waste so little
    when R << M: 300 s against an 1,875 h MTBF is 0.0044 % of the run."""
    _check("R", R, 0)
    _check("M", M, 0, strict=True, allow_inf=True)
    return 0.0 if math.isinf(M) else -math.expm1(-R / M)


def regime(C: float, R: float, M: float) -> tuple[str, str]:
    """Whether the checkpoint formulas apply: ``(kind, sentence)``.

    ``"no_progress"``: C + R >= M, a checkpoint (or a restart, or both together) takes as long as the
    mean time between failures; most of the time is lost at any interval (84 % at best at C = M) and
    the intervals mean nothing. ``"large"``: C or R above 5 % of M, first order is visibly off (Daly's
    interval and model still hold). ``"small"``: the formulas agree."""
    _check("C", C, 0)
    _check("R", R, 0)
    _check("M", M, 0, strict=True, allow_inf=True)
    if C + R >= M:
        what = ("a checkpoint takes" if C >= M else "a restart takes" if R >= M
                else "a checkpoint plus a restart take")
        return "no_progress", f"no progress: {what} longer than the mean time between failures"
    if max(C, R) > 0.05 * M:
        return "large", ("the checkpoint write or restart is not small against the MTBF: first order is off, "
                         "Daly's interval holds")
    return "small", "checkpoint and restart are small against the MTBF: the formulas agree"


def walltime_fit(interval_s: float, walltime_h: float) -> float:
    """Checkpoint interval over the allocation's walltime (checkpoints per allocation = 1 / ratio).

    Above 1 a job can end before its first checkpoint: its work never persists unless the scheduler's
    warning signal triggers a save (Slurm ``--signal``). Above 0.5 fewer than two checkpoints per
    allocation: up to half of every allocation is at risk at its end."""
    _check("interval_s", interval_s, 0, strict=True)
    _check("walltime_h", walltime_h, 0, strict=True)
    return interval_s / (walltime_h * 3600.0)
