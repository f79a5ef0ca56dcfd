"""Fault tolerance: how often a large job is interrupted, and how often it should checkpoint.

Failure is normal at scale (pitfalls brief, section 5). Model each node as failing independently with
probability ``p`` per day. The job survives a day only if all ``N`` nodes do::

    P(>= 1 failure in d days) = 1 - (1 - p)^(N d)          p = 1e-4, N = 1000: 9.5 % per day

The same ``p`` as a Poisson rate per node is ``lambda = -ln(1 - p)`` per day (~ p for small p); the
system fails at ``N lambda`` per day, so its mean time between failures is ``MTBF = 24 h / (N lambda)``
(240 h above). Public reference: the Llama 3 405B pre-training (Dubey et al. 2024, "The Llama 3 Herd
of Models", arXiv 2407.21783, section 3.3.4) saw 419 unexpected interruptions in 54 days on 16,384
H100 GPUs (2,048 nodes of 8): one every 3.1 hours, ``LLAMA3_RATE_PER_NODE_DAY`` = 419 / 54 / 2048 =
3.8e-3 per node-day, 38x the field report's 1e-4. The chapter judges every plan under both rates.

Every formula here assumes **exponential (memoryless) failures**: independent nodes, a constant rate,
no memory of the last failure. Real clusters deviate (infant mortality after maintenance, bursts from
a shared cause such as a switch or the file system, ageing parts); Young and Daly are then a first
guess to be checked against the site's failure log.

A checkpoint costs ``C`` seconds of writing; a failure costs the work since the last checkpoint plus
``R`` seconds of restart. Checkpoint every ``tau`` seconds of work. Young's first-order optimum
(Young 1974, "A first order approximation to the optimum checkpoint interval", CACM 17(9)) is
``sqrt(2 C M)``; Daly's higher-order one (Daly 2006, "A higher order estimate of the optimum
checkpoint interval for restart dumps", FGCS 22(3)) corrects it when ``C`` is not small against
``M``. ``daly_waste`` is Daly's complete model with exponential failures, which may strike during
work, checkpoint writes and restarts alike; it is exact for that process, and
``preflight.models.checkpoint_sim`` reproduces it by Monte Carlo. ``regime`` says when C + R reaches
M and no interval helps. Times are in seconds
unless a name says ``_h`` (hours) or ``_day``.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

LLAMA3 = {"interruptions": 419, "days": 54, "gpus": 16384, "gpus_per_node": 8}
LLAMA3_NODES = LLAMA3["gpus"] // LLAMA3["gpus_per_node"]                                   # 2,048
# Interruptions per node-day (a Poisson rate): 419 / 54 / 2048 = 3.79e-3. Dubey et al. 2024, "The Llama 3
# Herd of Models" (arXiv 2407.21783), section 3.3.4. Every unexpected interruption counts, not only hardware.
LLAMA3_RATE_PER_NODE_DAY = LLAMA3["interruptions"] / LLAMA3["days"] / LLAMA3_NODES
# The same rate as the daily probability a profile's ``cluster.node_failure_per_day`` holds: 3.78e-3.
LLAMA3_P_NODE_DAY = -math.expm1(-LLAMA3_RATE_PER_NODE_DAY)
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

    1e-4 per node-day on 1000 nodes: 9.52 % per day, 95.0 % over a 30-day run (1 - 0.9999^30000)."""
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
    with np.errstate(divide="ignore", over="ignore"):
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
    n3, p3 = LLAMA3_NODES, LLAMA3_P_NODE_DAY
    per_day3 = LLAMA3["interruptions"] / LLAMA3["days"]
    rows = [
        ("field report", FIELD["nodes"], FIELD["p_node_day"],
         run_failures(FIELD["p_node_day"], FIELD["nodes"], 1.0), failure_prob(FIELD["p_node_day"], FIELD["nodes"]),
         system_mtbf_h(FIELD["p_node_day"], FIELD["nodes"]),
         "field report: 1.0e-4 failures per node-day, 1,000 nodes"),
        ("Llama 3 405B", n3, p3, per_day3, failure_prob(p3, n3),
         mtbf_from_interruptions(LLAMA3["interruptions"], LLAMA3["days"]),
         "Dubey et al. 2024, \"The Llama 3 Herd of Models\" (arXiv 2407.21783), section 3.3.4: "
         "419 unexpected interruptions in 54 days on 16,384 H100 GPUs"),
    ]
    return pd.DataFrame(rows, columns=list(REFERENCE_COLUMNS))


# -- how often to checkpoint -------------------------------------------------------------------------

# What a checkpoint saves per parameter, by framework (the states of ``preflight.models.states`` less the
# gradients, which are not saved): DeepSpeed and Megatron 16-bit weights 2 + fp32 master weights 4 + Adam's
# m and v 8 = 14 B (DeepSpeed's mp_rank / zero_pp_rank files; Megatron's distributed checkpoint of the
# distributed optimizer); FSDP2 fp32 sharded parameters 4 + m and v 8 = 12 B (torch.distributed.checkpoint
# of model and optimizer state dicts).
CHECKPOINT_BYTES_PER_PARAM = {"deepspeed": 14, "megatron": 14, "fsdp2": 12, "ddp": 12}


def checkpoint_seconds(params: float, framework: str, write_GBps: float) -> float:
    """C from bytes: the state a checkpoint saves (``CHECKPOINT_BYTES_PER_PARAM``) over the aggregate
    write bandwidth the job gets from its file system (every rank writes its shard at once). 70B with
    DeepSpeed at 100 GB/s: 980 GB in 9.8 s."""
    _check("params", params, 0, strict=True)
    _check("write_GBps", write_GBps, 0, strict=True)
    return params * CHECKPOINT_BYTES_PER_PARAM[framework] / (write_GBps * 1e9)


# Asynchronous saves (Megatron --async-save, torch.distributed.checkpoint.async_save, torchtitan): the training
# waits only while each rank copies its shard of the state to host memory; the file-system write runs in the
# background. PCIe Gen4 x16 moves ~25 GB/s device-to-host (Gen5 about twice): chapter 5's stall measurement
# (preflight.bench.ckptstall) gives the node's own figure.
HOST_STAGING_GBps = 25.0


def async_blocking_seconds(params: float, framework: str, gpus: int, host_GBps: float = HOST_STAGING_GBps) -> float:
    """C of an asynchronous save: the blocking part, each GPU staging its 1/gpus share of the state
    (``CHECKPOINT_BYTES_PER_PARAM``) to host memory. 70B with DeepSpeed on 64 GPUs: 15.3 GB each, 0.61 s."""
    _check("params", params, 0, strict=True)
    _check("host_GBps", host_GBps, 0, strict=True)
    return params * CHECKPOINT_BYTES_PER_PARAM[framework] / max(1, gpus) / (host_GBps * 1e9)


def queue_waste(queue_wait_s: float, run_s: float, walltime_h: float) -> float:
    """Share of the run spent waiting in the queue after the requeue of each allocation that ends at the
    walltime (``run / walltime - 1`` of them); a failure's requeue is paid in the restart time R."""
    _check("queue_wait_s", queue_wait_s, 0)
    _check("run_s", run_s, 0, strict=True)
    requeues = max(0.0, run_s / (walltime_h * 3600) - 1)
    return queue_wait_s * requeues / (run_s + queue_wait_s * requeues)


def young_interval(C: float, M: float) -> float:
    """Young's optimum compute time between checkpoints: ``sqrt(2 C M)``. C = 60 s, M = 24 h: 3,220 s.

    It balances the checkpoint cost per unit of work, ``C / tau``, against the expected loss, half an
    interval per failure, ``tau / (2 M)``; the sum is smallest where both are equal. "Half an interval"
    holds for exponential (memoryless) failures at a constant rate ``1/M``."""
    _check("C", C, 0)
    _check("M", M, 0, strict=True, allow_inf=True)
    return math.sqrt(2.0 * C * M)


def daly_interval(C: float, M: float) -> float:
    """Daly's higher-order optimum: ``sqrt(2CM) [1 + s/3 + s^2/9] - C`` with ``s = sqrt(C / 2M)``, for
    C < 2M; ``M`` otherwise. Equal to ``2 M s (1 - s/3)^2``: always positive, at least Young - C, and
    Young's value when C << M. Daly 2006, eq. 37; the optimum does not depend on R. Derived for
    exponential (memoryless) failures, like Young's."""
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
