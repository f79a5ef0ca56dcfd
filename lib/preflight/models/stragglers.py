"""Stragglers: a synchronous step waits for the slowest of N ranks.

Data-parallel training (and every collective) is a barrier: each step lasts as long as its slowest
rank's compute. Give every rank a step time with independent jitter ``T_i = mu (1 + cv Z_i)``,
``Z_i`` standard normal (OS noise, thermal and power throttling, a slower HBM stack, network retries),
and the step lasts ``max_i T_i``. Its expectation grows with N although no rank got slower::

    E[max of N] = mu (1 + cv e_N),   e_N = E[max of N standard normals] ~ sqrt(2 ln N) for large N

``e_N`` integrated exactly (Blom's approximation ``Phi^-1((N - 0.375) / (N + 0.25))`` beside it): 0.56
at N = 2, 1.42 at 8, 3.25 at 1,024, 3.97 at 16,384. So 2 % of per-rank jitter costs 6.5 % at 1,024 GPUs
and 8 % at 16k: the cost of jitter grows with the job, which is
why large runs hunt the slow ranks (Llama 3's report, sec. 3.3.4: tools to find stragglers among 16k
GPUs) and why a trace audit's "who arrives last" (``load_balance/trace_collective_wait``) is worth
reading. One persistently slow rank is another matter: it sets the pace every step.

The saying "a few slow GPUs don't matter at scale" has it backwards: the expected maximum rises with N.
"""
from __future__ import annotations

import functools
import math
from statistics import NormalDist

BLOM_ALPHA = 0.375


@functools.lru_cache(maxsize=256)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals], integrated: ``int x n phi(x) Phi(x)^(n-1) dx`` on a
    fine grid (0 at n = 1, 0.5642 at 2, 1.4236 at 8, 3.248 at 1,024)."""
    import numpy as np

    if n < 1:
        raise ValueError(f"n = {n}: must be >= 1")
    if n == 1:
        return 0.0
    x = np.linspace(-8.0, 8.0 + math.sqrt(2 * math.log(n)), 40_001)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    pdf = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    return float(np.trapezoid(x * n * pdf * cdf ** (n - 1), x))


def blom(n: int) -> float:
    """Blom's approximation ``Phi^-1((n - 0.375) / (n + 0.25))`` (Blom 1958): 4 % high at n = 2, under 1 %
    from n = 8 on; what a back-of-the-envelope uses."""
    return NormalDist().inv_cdf((n - BLOM_ALPHA) / (n - 2 * BLOM_ALPHA + 1)) if n > 1 else 0.0


def slowdown(n: int, cv: float) -> float:
    """Expected step time over the mean rank's: ``1 + cv e_n`` (``cv`` = per-rank step-time jitter,
    standard deviation over mean)."""
    if not 0 <= cv <= 1:
        raise ValueError(f"cv = {cv}: the per-rank jitter must be 0 to 1 (a share of the step)")
    return 1.0 + cv * expected_max_normal(n)


def simulate_slowdown(n: int, cv: float, steps: int = 2000, seed: int = 0) -> float:
    """The same by Monte Carlo: the mean over ``steps`` of max_i T_i / mu with normal jitter (numpy)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return float((1.0 + cv * rng.standard_normal((steps, n))).max(axis=1).mean())


def large_n(n: int) -> float:
    """The asymptote ``sqrt(2 ln n)`` people quote, beside Blom's value (it overstates for small n)."""
    return math.sqrt(2 * math.log(n)) if n > 1 else 0.0
