"""What data-parallel gradients cost to move.

Ring all-reduce (Patarasuk & Yuan 2009; the NCCL convention): each of ``D`` ranks sends and
receives ``2 (D-1)/D`` times the buffer ``S`` (reduce-scatter, then all-gather), in ``2 (D-1)``
latency-bound steps::

    t = 2 (D-1)/D * S / B  +  2 (D-1) * alpha

With tensor (tp) and pipeline (pp) parallelism each data-parallel rank holds ``M / (tp pp)``
parameters. Example (pitfalls brief): 7e9 parameters in FP32, large D: about 2 * 7e9 * 4 B = 56 GB
per rank per step; at 200 Gb/s = 25 GB/s that is over 2 s, against 0.8 s of compute.

Measured bandwidths follow nccl-tests: ``algbw = S / t`` and ``busbw = algbw * 2 (D-1)/D``.
"""
from __future__ import annotations

BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2}


def gbps_to_GBps(gbit_per_s: float) -> float:
    """Network links are quoted in Gb/s (bits); memory and buses in GB/s (bytes)."""
    return gbit_per_s / 8.0


def allreduce_bytes_per_rank(params: float, dp: int, grad_dtype: str = "fp32",
                             tp: int = 1, pp: int = 1) -> float:
    """Bytes each data-parallel rank sends (and receives) per step: ``2 M/(tp pp) (D-1)/D b``."""
    if dp < 1 or tp < 1 or pp < 1:
        raise ValueError(f"dp, tp, pp must be >= 1 (got {dp}, {tp}, {pp})")
    b = BYTES_PER_ELEMENT[grad_dtype]
    return 2.0 * params / (tp * pp) * (dp - 1) / dp * b


def ring_allreduce_time(buffer_bytes: float, ranks: int, bandwidth_GBps: float,
                        latency_s: float = 0.0) -> float:
    """Seconds for a ring all-reduce of ``buffer_bytes`` over ``ranks`` at ``bandwidth_GBps``."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1 (got {ranks})")
    if ranks == 1:
        return 0.0
    if bandwidth_GBps <= 0:
        raise ValueError(f"bandwidth must be > 0 (got {bandwidth_GBps})")
    return 2 * (ranks - 1) / ranks * buffer_bytes / (bandwidth_GBps * 1e9) + 2 * (ranks - 1) * latency_s


def busbw_factor(ranks: int) -> float:
    """nccl-tests bus-bandwidth factor for all-reduce, ``2 (n-1)/n``."""
    return 2 * (ranks - 1) / ranks
