"""The predict-then-measure exercises of each chapter (``preflight.exercises``), on the learner's own
profile. Answers are computed by the library when checked: formulas of ``preflight.models`` or, where
a chapter passes its measurement, the number measured on this machine.
"""
from __future__ import annotations

import math

from preflight.exercises import Exercise
from preflight.profile import Profile

GiB = 2 ** 30


def baseline(profile: Profile, fusion_speedup: float | None = None) -> dict[str, Exercise]:
    from preflight.models import scaling

    t = profile.training
    n = 256
    ex = {
        "amdahl": Exercise(
            "amdahl", f"Each step has {t.step_serial_s:g} s of serial work and {t.step_compute_s:g} s that "
            f"parallelises. How many times faster than one GPU can {n} GPUs run it (strong scaling)?", "x",
            lambda: scaling.amdahl_speedup(t.step_serial_s, t.step_compute_s, n),
            f"Amdahl: (Ts + Tc) / (Ts + Tc/N). The serial part caps the speedup at 1 + Tc/Ts = "
            f"{scaling.amdahl_ceiling(t.step_serial_s, t.step_compute_s):.3g}x however many GPUs are added.",
            rel_tol=0.2, log=True),
        "model_states": Exercise(
            "model_states", f"A {profile.model.params / 1e9:g}B-parameter model trained with mixed-precision Adam "
            "and no ZeRO, on one GPU (no tensor or pipeline parallelism): how many GiB do weights + gradients + "
            "optimizer state take?", "GiB",
            lambda: 16 * profile.model.params / GiB,
            "2 bytes of weights + 2 of gradients + 12 of optimizer state (fp32 master, momentum, variance) = "
            "16 bytes per parameter, before a single activation (Rajbhandari et al. 2020).", rel_tol=0.15),
    }
    if fusion_speedup:
        ex["fusion"] = Exercise(
            "fusion", "torch.compile fuses GELU + add + LayerNorm into fewer kernels. How many times faster is "
            "the fused block than the eager one on this machine?", "x", lambda: fusion_speedup,
            "Memory-bound ops gain from fusion by not writing intermediates to memory; the gain is larger on a "
            "GPU, where those ops are a bigger share of the step.", rel_tol=0.2, log=True)
    return ex


def data_pipeline(profile: Profile) -> dict[str, Exercise]:
    from preflight.models import data as D

    d = profile.data
    return {
        "listing": Exercise(
            "listing", f"The dataset has {d.files:,} files on {d.storage}. How many minutes does merely listing "
            "them (one metadata operation each) take before the first batch?", "min",
            lambda: D.listing_time_s(d.files, d.storage) / 60,
            f"Per-file metadata latency on {d.storage} is {D.latency(d.storage).stat_s * 1e3:g} ms, paid once per "
            "file by every process that lists them; shards of 256 MB cut the count by orders of magnitude.",
            rel_tol=0.5, log=True),
        "workers": Exercise(
            "workers", "The GPU consumes 2,000 samples/s and one loader worker preprocesses 600 samples/s. How "
            "many workers give the 1.2x supply headroom?", "workers", lambda: D.workers_needed(2000, 600),
            "ceil(1.2 x 2000 / 600) = 4: headroom absorbs jitter; fewer workers leave the GPU waiting.",
            rel_tol=0.01),
    }


def communication(profile: Profile) -> dict[str, Exercise]:
    from preflight.chapters.communication import allreduce_plan

    t, c = profile.training, profile.cluster
    p = allreduce_plan(profile)             # preflight.models.comm.allreduce_plan on the profile
    link = (f"At {c.inter_node_Gbps:g} Gb/s per GPU between nodes" if p.link == "inter-node" else
            f"Inside one node, at {c.intra_node_GBps:g} GB/s per GPU over NVLink")
    return {
        "volume": Exercise(
            "volume", f"Ring AllReduce of {profile.model.params / 1e9:g}B {t.grad_dtype} gradients over "
            f"dp={profile.dp} ranks: how many GB does each GPU send per step?", "GB", lambda: p.bytes_per_rank / 1e9,
            "2 (D-1)/D x the gradient bytes: every byte goes out twice (reduce-scatter, all-gather), nearly "
            "independent of D.", rel_tol=0.2, log=True),
        "time": Exercise(
            "time", f"{link}, how many seconds does that AllReduce take if nothing overlaps it?", "s",
            lambda: p.flat_s,
            "Gb/s are bits: divide by 8 for GB/s; the ring also pays 2 (D-1) latency steps. Compare it with "
            "the compute per step: that ratio decides whether overlap, bucketing and bf16 gradients matter.",
            rel_tol=0.3, log=True),
    }


def load_balance(profile: Profile) -> dict[str, Exercise]:
    from preflight.models import pipeline as P

    return {
        "bubble": Exercise(
            "bubble", "A pipeline of p=4 stages runs m=8 micro-batches per step (1F1B). What share of the step "
            "does each GPU sit idle in the bubble?", "%", lambda: 100 * P.bubble_fraction(4, 8),
            "(p-1)/(m+p-1) = 3/11: the popular (p-1)/(m p) = 9.4 % divides the fill and drain by the wrong "
            "length. More micro-batches or interleaving shrink it.", rel_tol=0.15),
        "bubble_m": Exercise(
            "bubble_m", "Same pipeline: how many micro-batches m bring the bubble under 10 %?", "micro-batches",
            lambda: float(next(m for m in range(1, 10_000) if P.bubble_fraction(4, m) < 0.10)),
            "(p-1)/(m+p-1) < 0.1 needs m > 9(p-1) = 27: Megatron's rule of thumb m >= 4p is not enough for 10 %.",
            rel_tol=0.15),
    }


def fault_tolerance(profile: Profile) -> dict[str, Exercise]:
    from preflight.models import resilience as R

    c, t = profile.cluster, profile.training
    mtbf_s = R.system_mtbf_h(c.node_failure_per_day, c.nodes) * 3600
    ex = {
        "day": Exercise(
            "day", "1,000 nodes each fail with probability 1e-4 on a given day. What is the probability that at "
            "least one fails today?", "%", lambda: 100 * R.failure_prob(1e-4, 1000, 1.0),
            "1 - (1 - p)^N = 9.5 %: small per-node odds, multiplied by a thousand nodes.", rel_tol=0.2, log=True),
    }
    if math.isfinite(mtbf_s):
        ex["interval"] = Exercise(
            "interval", f"Writing a checkpoint takes {t.checkpoint_write_s:g} s and the system MTBF is "
            f"{mtbf_s / 3600:,.0f} h. How many hours between checkpoints minimise the expected waste?", "h",
            lambda: R.daly_interval(t.checkpoint_write_s, mtbf_s) / 3600,
            "Young: sqrt(2 C M); Daly refines it when C is not small against M. The waste curve is flat near its "
            "minimum, so anything within a factor of ~1.5 costs little.", rel_tol=0.5, log=True)
    return ex
