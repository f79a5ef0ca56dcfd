"""The layout advisor (``python -m preflight advise PROFILE``): which plan would pass, and which is fastest.

It searches with the chapters' own models, so it is only as good as they are:

* **enumerate** every layout the profile's cluster allows: tp dividing the GPUs per node, the heads
  and the key/value heads; pp dividing the layers or a power of two (uneven stages); dp = GPUs / (tp pp); the
  framework's ZeRO stages
  (``preflight.models.states.STAGES``); recompute none / selective / full; sequence parallelism with
  tp > 1; micro-batch sizes 1, 2, 4, 8 and the micro-batches per step that keep the global batch
  (``--global-batch``, else the profile's ``micro_batch_size x microbatches x dp`` sequences);
  interleaving v = 2, 4 with pp > 1 where v pp divides the layers and pp divides m; context parallelism
  cp (Megatron, FSDP2; flash attention) while each GPU keeps ``CP_MIN_TOKENS`` of a sequence, dp =
  GPUs / (tp pp cp);
* **keep** those whose memory per GPU (``preflight.models.memory``, the chapter's planner) passes the
  chapter's verdict: plan / GPU memory <= ``memory_plan.FIT_WARN`` (90 %);
* **rank** them by predicted tokens/s per GPU (``preflight.models.throughput.step_time``: compute at
  the efficiency, bubble, exposed tp / pp / dp communication, recompute's extra forward), MFU with it.

The efficiency is ``--efficiency`` if given, or ``--mfu-from AUDIT`` (chapter 1's measured MFU in an
audit's findings.json, the reference model's or the team's own workload's: ``measured_efficiency``),
else ``throughput.DEFAULT_EFFICIENCY`` (the source is stated in every output). When no layout fits, ``advise``
says by how much the closest one misses and what would close it (``no_fit``).
"""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

from preflight.chapters import memory_plan as MP
from preflight.chapters import step as S
from preflight.chapters.advisor_text import label, own_plan, table, text_report, why_faster  # noqa: F401  (the public surface)
from preflight.chapters.load_balance import BUBBLE_FAIL, BUBBLE_WARN
from preflight.core import hardware
from preflight.core.findings import judge
from preflight.core.numfmt import factor, percent
from preflight.core.profile import Profile
from preflight.models import EFFICIENCY_RANGE
from preflight.models import memory as M
from preflight.models import throughput as T
from preflight.models.pipeline import bubble_fraction
from preflight.models.states import STAGES

MICRO_BATCH_MAX = 16                 # micro-batch sizes: every divisor of a replica's batch up to this
INTERLEAVE_MAX = 16                  # model chunks per device (Megatron's virtual pipeline size)
# The recompute policies each framework has: Megatron's selective (core attention) and full;
# DeepSpeed's activation checkpointing (full layers); torchtitan's op-level selective and full (FSDP2).
RECOMPUTE = M.RECOMPUTE              # the memory planner's policies, cheapest first
FRAMEWORK_RECOMPUTE = {"megatron": ("none", "selective", "full"), "deepspeed": ("none", "full"),
                       "fsdp2": ("none", "op_selective", "full"), "ddp": ("none", "full")}
# Context parallelism is enumerated only while each GPU keeps at least this many tokens of a sequence: below
# it the K/V ring cannot hide behind attention (preflight.models.context: its ratio grows as cp / s).
CP_MIN_TOKENS = 4096
CP_FRAMEWORKS = ("megatron", "fsdp2")    # ring attention: Megatron-Core / Transformer Engine, torchtitan
TIE_BAND = 0.01                      # layouts this close in predicted tokens/s rank by memory headroom
GLOBAL_BATCH_MAX = 10_000_000
TOP_MAX = 1000


def global_batch(profile: Profile) -> int:
    """Sequences per optimizer step that the profile implies: micro_batch_size x microbatches x dp."""
    t = profile.training
    return t.micro_batch_size * t.microbatches * profile.dp


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _recompute(profile: Profile) -> tuple[str, ...]:
    """The framework's recompute policies. Megatron's selective recompute checkpoints the core attention
    (``recompute_modules: core_attn``) whatever the attention backend: with flash attention it re-runs the
    fused forward and saves its output and statistics (little memory, some compute), so it stays a choice."""
    return FRAMEWORK_RECOMPUTE[profile.training.framework]


def supported(framework: str, zero_stage: int, pp: int) -> bool:
    """Whether the framework runs this combination: DeepSpeed's pipeline engine takes ZeRO-1 at most."""
    return not (framework == "deepspeed" and pp > 1 and zero_stage >= 2)


def layouts(profile: Profile, batch: int):
    """Every ``throughput.Layout`` the cluster, the model and the framework allow for a global batch of
    ``batch``."""
    m, c, t = profile.model, profile.cluster, profile.training
    gpus = profile.gpus
    tps = [x for x in _divisors(c.gpus_per_node) if m.n_heads % x == 0 and m.n_kv_heads % x == 0]
    if t.framework == "ddp":                  # plain DDP replicates the whole model: no tp, no pp
        tps = [1]
    rcs = _recompute(profile)
    cps = [c for c in _divisors(gpus) if c == 1 or (t.framework in CP_FRAMEWORKS and m.attention == "flash"
                                                  and m.seq_len % (2 * c) == 0 and m.seq_len // c >= CP_MIN_TOKENS)]
    # pp: the divisors of the layers, and the powers of two up to them (uneven stages, as Llama 3 405B's 126
    # layers on 16 stages: Megatron's --decoder-first/last-pipeline-num-layers)
    pps = sorted(set(_divisors(m.layers)) | {2 ** k for k in range(1, 11) if 2 ** k <= m.layers})
    if t.framework == "ddp":
        pps = [1]
    for tp, pp, cp in itertools.product(tps, pps, cps):
        if gpus % (tp * pp * cp):
            continue
        dp = gpus // (tp * pp * cp)
        if batch % dp:
            continue
        eps = [e for e in _divisors(dp) if m.experts % e == 0] if m.experts else [1]
        for mbs in [d for d in _divisors(batch // dp) if d <= MICRO_BATCH_MAX]:
            mb = batch // (dp * mbs)
            vs = [1] + [v for v in range(2, INTERLEAVE_MAX + 1)
                        if pp > 1 and m.layers % (pp * v) == 0 and mb % pp == 0]
            for z, rc, sp, v, ep in itertools.product(STAGES[t.framework], rcs, (False, True), vs, eps):
                if (sp and tp == 1) or not supported(t.framework, z, pp):
                    continue
                yield T.Layout(tp=tp, pp=pp, dp=dp, zero_stage=z, activation_recompute=rc, sequence_parallel=sp,
                               micro_batch_size=mbs, microbatches=mb, interleave=v, ep=ep, cp=cp,
                               recompute_modules=S.recompute_modules(profile, rc))


def memory_plan(profile: Profile, lay: T.Layout) -> M.Plan:
    """The chapter's planner input for ``lay`` (``memory_plan.plan_of`` with the layout's fields)."""
    return MP.plan_of(profile, tp=lay.tp, pp=lay.pp, dp=lay.dp, zero_stage=lay.zero_stage,
                      recompute=lay.activation_recompute, sequence_parallel=lay.sequence_parallel,
                      micro_batch_size=lay.micro_batch_size, microbatches=lay.microbatches,
                      schedule=("interleaved" if lay.interleave > 1 else "1f1b"), interleave=lay.interleave, ep=lay.ep,
                      cp=lay.cp, recompute_modules=lay.recompute_modules)


def _step(profile: Profile, lay: T.Layout, cluster: T.Cluster, efficiency: float | None) -> dict:
    return S.time_layout(profile, lay, cluster, efficiency).as_dict()


def evaluate(profile: Profile, lay: T.Layout, capacity: float, cluster: T.Cluster, efficiency: float) -> dict:
    """One candidate: the layout, its memory and step time, and its verdicts (memory, bubble)."""
    mem = M.total_bytes(memory_plan(profile, lay))
    ratio = mem / capacity
    mem_v, _ = judge(ratio, warn=MP.FIT_WARN, fail=MP.FIT_FAIL, higher_is_better=False)
    bub = bubble_fraction(lay.pp, lay.microbatches, lay.interleave)
    bub_v, _ = judge(bub, warn=BUBBLE_WARN, fail=BUBBLE_FAIL, higher_is_better=False)
    return {**dict(lay.__dict__), "memory_per_gpu_bytes": mem, "memory_ratio": ratio, "fits": ratio <= MP.FIT_FAIL,
            **_step(profile, lay, cluster, efficiency), "bubble_fraction": bub,
            "verdicts": {"baseline/memory_fits": mem_v, "load_balance/bubble_fraction": bub_v}}


def at_efficiency(profile: Profile, result: dict, efficiency: float | None, gpu_key: str | None = None) -> list[dict]:
    """``result``'s fitting candidates (from :func:`advise`) re-timed and re-ranked at another efficiency:
    memory does not depend on it, the ranking can (a faster kernel leaves less compute to hide the
    communication behind). For the chapter's slider; the same step model as ``advise``."""
    cluster = S.cluster_of(profile, _gpu_key(profile, gpu_key))          # once, not per candidate
    return sorted((_retimed(profile, c, cluster, efficiency) for c in result["candidates"] if c["fits"]),
                  key=_rank_key)


def retime(profile: Profile, c: dict, efficiency: float | None, gpu_key: str | None = None) -> dict:
    """Candidate ``c`` with its step re-timed at ``efficiency`` (its memory and verdicts unchanged)."""
    return _retimed(profile, c, S.cluster_of(profile, _gpu_key(profile, gpu_key)), efficiency)


def _retimed(profile: Profile, c: dict, cluster: T.Cluster, efficiency: float | None) -> dict:
    return c | _step(profile, T.Layout(**{k: c[k] for k in T.Layout.__dataclass_fields__}), cluster, efficiency)


def _gpu_key(profile: Profile, gpu_key: str | None) -> str | None:
    """The GPU to plan for: ``gpu_key`` (the probed one under ``gpu: auto``), else the profile's."""
    return gpu_key or (None if profile.cluster.gpu == "auto" else profile.cluster.gpu)


def usable_efficiency(value: float) -> bool:
    """Whether a measured MFU can stand for the kernels' efficiency (``models.EFFICIENCY_RANGE``)."""
    return EFFICIENCY_RANGE[0] <= value <= EFFICIENCY_RANGE[1]


def efficiency_gap(implied: float | None, efficiency: float, tolerance: float = 0.05) -> str | None:
    """A line when the profile's own step time implies another share of the peak (``implied``: the
    finding ``baseline/implied_mfu``) than the advisor ranks at (``efficiency``), more than ``tolerance``
    apart; else None. The advisor's compute times scale as 1 / efficiency: ranked at a higher efficiency
    than the step shows they are too short by efficiency / implied, at a lower one too long."""
    if not implied or abs(implied - efficiency) <= tolerance:
        return None
    way, k = ("short", efficiency / implied) if efficiency > implied else ("long", implied / efficiency)
    return (f"The profile's own step time implies {percent(implied)} of the peak while computing "
            f"(baseline/implied_mfu), not {percent(efficiency)}: the advisor's compute times are then "
            f"{factor(k)} too {way}. To rank at your step's efficiency: "
            f"python -m preflight advise PROFILE --efficiency {implied:.2f}")


def measured_efficiency(audit: str | Path, profile: Profile | None = None) -> tuple[float, str]:
    """Chapter 1's measured MFU (``baseline/mfu``) from an audit's findings.json (or its folder), with
    where it comes from. ValueError, naming ``--mfu-from``, when there is none: a plan-only audit, a CPU
    (no datasheet peak, so MFU is left empty), a finding outside 1-100 %. A GPU other than the profile's
    is said in the source, not refused: the ratio often carries over between chips of one generation."""
    path = Path(audit)
    path = path / "findings.json" if path.is_dir() else path
    try:
        summary = json.loads(path.read_text())
        found = {f["id"]: f for f in summary["findings"]}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"--mfu-from = {str(audit)!r}: not an audit's findings.json ({type(err).__name__}: "
                         f"{err})") from None
    f = found.get("baseline/mfu")
    t = found.get("baseline/trace_mfu")
    if (f is None or f.get("value") is None) and t is not None and t.get("value") is not None:
        return _trace_efficiency(audit, path, summary, t)
    if f is None or f.get("value") is None:
        why = f["message"] if f else "no baseline/mfu finding (chapter 1 did not run)"
        why += f"; baseline/trace_mfu: {t['message']}" if t else ""
        raise ValueError(f"--mfu-from = {str(audit)!r}: no MFU from chapter 1 there ({why}); MFU needs a "
                         "measure-mode audit on a GPU with a datasheet peak (or pass --efficiency)")
    value = float(f["value"])
    if not usable_efficiency(value):
        raise ValueError(f"--mfu-from = {str(audit)!r}: baseline/mfu = {value:g}, outside the accepted "
                         f"{EFFICIENCY_RANGE[0]:g}-{EFFICIENCY_RANGE[1]:g} of the peak")
    machine = summary.get("machine") or {}
    on = machine.get("label") or machine.get("name") or "an unnamed device"
    w = summary.get("workload")
    what = f"workload {w['class']}" if isinstance(w, dict) and w.get("class") else "the reference model"
    other = (profile is not None and machine.get("table_key") and profile.cluster.gpu not in ("auto", machine["table_key"]))
    return value, (f"chapter 1's measured MFU of {what} on {on} ({path}, {str(summary.get('date', ''))[:10]})"
                   + (f"; measured on {machine['table_key']}, planned for {profile.cluster.gpu}" if other else ""))


def _trace_efficiency(audit, path: Path, summary: dict, f: dict) -> tuple[float, str]:
    """The MFU a job's traces show (``baseline/trace_mfu``), from ``traces --json`` or ``audit --traces``:
    the median over the ranks (the finding's value is the worst rank's, the one a verdict judges)."""
    import statistics

    per = [v for v in (f.get("per_rank") or {}).values() if v is not None] or [float(f["value"])]
    value = statistics.median(per)
    if not usable_efficiency(value):
        raise ValueError(f"--mfu-from = {str(audit)!r}: baseline/trace_mfu = {value:g} (median of {len(per)} ranks), "
                         f"outside the accepted {EFFICIENCY_RANGE[0]:g}-{EFFICIENCY_RANGE[1]:g} of the peak")
    folder = (summary.get("traces") or {}).get("folder") or summary.get("folder") or path
    return value, (f"the MFU your job's traces show, the median of {len(per)} rank(s) ({folder}; "
                   f"{f['message'].split(',')[0]} on the worst rank)")


def advise(profile: Profile, *, batch: int | None = None, efficiency: float | None = None,
           gpu_key: str | None = None, capacity: float | None = None, efficiency_source: str | None = None) -> dict:
    """Every candidate layout, best first (fitting ones by tokens/s per GPU, then the rest by memory).

    Returns {"candidates", "fitting", "global_batch", "efficiency", "efficiency_source", "capacity",
    "no_fit"}; ``no_fit`` is None when a layout fits (else ``no_fit``'s advice). ``gpu_key`` and
    ``capacity`` default to the profile's GPU (the hardware table, or ``cluster.gpu_memory_GB``).
    ValueError when the global batch fits no layout or the GPU has no known peak."""
    batch = global_batch(profile) if batch is None else batch
    gpu_key = _gpu_key(profile, gpu_key)
    if capacity is None:
        capacity, _ = MP.capacity_bytes(profile)
    if capacity is None:
        raise ValueError("cluster.gpu = 'auto': name the GPU (or set cluster.gpu_memory_GB) to plan its memory")
    source = efficiency_source or "--efficiency" if efficiency is not None else (
        "the GEMM efficiency model, calibrated on published runs (docs/advisor-validation.md); measure "
        "yours: chapter 1's MFU on a GPU, then advise --mfu-from")
    cluster = S.cluster_of(profile, gpu_key)
    cands = [evaluate(profile, lay, capacity, cluster, efficiency) for lay in layouts(profile, batch)]
    if not cands:
        raise ValueError(f"global batch (--global-batch, or the profile's micro_batch_size x microbatches x dp) = {batch} "
                         f"sequences: no layout divides it (dp x micro-batch size must "
                         f"divide it, dp = {profile.gpus} GPUs / (tp pp)); choose a multiple of the data-parallel "
                         "sizes, e.g. a multiple of " + str(profile.gpus))
    fitting = sorted((c for c in cands if c["fits"]), key=_rank_key)
    rest = sorted((c for c in cands if not c["fits"]), key=lambda c: c["memory_ratio"])
    ranked = fitting + rest
    if efficiency is None:          # per layout, from its shapes: say the top one's
        source = f"{source}; {ranked[0]['efficiency']:.0%} for the top layout"
    return {"candidates": ranked, "fitting": len(fitting), "global_batch": batch,
            "efficiency": ranked[0]["efficiency"] if efficiency is None else efficiency,
            "efficiency_modelled": efficiency is None, "efficiency_source": source, "capacity": capacity,
            "plan": plan_entry(profile, ranked, len(fitting), capacity, cluster, efficiency),
            "not_modelled": not_modelled(profile),
            "no_fit": None if fitting else no_fit(profile, rest[0], capacity, batch)}


def plan_entry(profile: Profile, ranked: list[dict], fitting: int, capacity: float, cluster: T.Cluster,
               efficiency: float | None) -> dict:
    """The profile's own plan as a candidate (evaluated even where the enumeration does not hold it: an
    interleaving or micro-batch the search skips), with its rank among the fitting layouts and the gap
    to the best: ``gap_to_best`` = best tokens/s over the plan's - 1."""
    lay = S.layout_of(profile)
    c = evaluate(profile, lay, capacity, cluster, efficiency)
    mine = _rank_key(c)
    faster = sum(_rank_key(x) < mine for x in ranked[:fitting])          # ranked as advise ranks
    best = ranked[0]["tokens_per_s_per_gpu"] if fitting else None
    return c | {"rank": faster + 1 if c["fits"] else None, "of": fitting,
                "gap_to_best": (best / c["tokens_per_s_per_gpu"] - 1) if best else None,
                "why_best": why_faster(ranked[0], c) if best else None}


def evaluate_plan(profile: Profile, efficiency: float | None = None, gpu_key: str | None = None) -> dict:
    """The profile's own plan alone (no search): its step, memory and verdicts. For the published-runs
    check and the widgets."""
    gpu_key = _gpu_key(profile, gpu_key)
    capacity, _ = MP.capacity_bytes(profile)
    lay = S.layout_of(profile)
    return evaluate(profile, lay, capacity, S.cluster_of(profile, gpu_key), efficiency)


def not_modelled(profile: Profile) -> list[str]:
    """What the step model cannot see in this plan, said rather than guessed."""
    out = []
    t = profile.training
    if t.cp > 1 or profile.model.seq_len >= 2 * CP_MIN_TOKENS:
        out.append("context parallelism: Megatron / Transformer Engine's key/value ring, overlapped step by step with "
                   "attention; Llama 3's all-gather variant is shown in chapter 3, DeepSpeed-Ulysses (all-to-all over "
                   f"heads) is not modelled; cp is searched while s / cp >= {CP_MIN_TOKENS} tokens")
    if profile.model.experts:
        t_ = profile.training
        out.append("mixture-of-experts: all-to-alls " + ("overlapped with another micro-batch's compute (training."
                   "moe_a2a_overlap)" if t_.moe_a2a_overlap else "counted blocking (set training.moe_a2a_overlap for "
                   "DualPipe / --overlap-moe-expert-parallel-comm)") + "; routing balanced on average (the busiest "
                   "expert's extra load is chapter 4's); of the recompute modules (training.recompute_modules) the "
                   "GEMMs are timed, their elementwise passes not")
    if t.fp8:
        out.append(f"fp8 ({t.fp8_recipe}): the linear layers' GEMM math at the FP8 peak (their shape overhead as in "
                   "bf16), attention and the rest of the step in bf16, each GEMM operand's cast a memory-bound pass "
                   "(fitted on Megatron-Bridge's fp8 and MXFP8 rows; torchtitan's fp8 rows on H100, held out, read "
                   "1.14-2.88x too fast)")
    if t.scaling == "strong":
        out.append("strong scaling: the advisor ranks layouts at the profile's global batch")
    return out


def _rank_key(c: dict) -> tuple:
    """Fastest first, in steps of ``TIE_BAND`` (1 %: inside any step model's error, so a tie), broken
    toward memory headroom (the plan that survives a longer sequence or a larger batch), then the
    simpler one: lower ZeRO stage, less recompute, no sequence parallelism, no interleaving."""
    return (-math.floor(math.log(c["tokens_per_s_per_gpu"]) / math.log1p(TIE_BAND)), round(c["memory_ratio"], 2),
            c["zero_stage"], RECOMPUTE.index(c["activation_recompute"]), c["sequence_parallel"], c["interleave"])


def no_fit(profile: Profile, closest: dict, capacity: float, batch: int) -> dict:
    """Why nothing fits, and what would: the closest layout's shortfall (bytes over 90 % of the GPU), the
    smallest GPU of the hardware table that would hold it, and the fewest nodes (doubling) with a fit."""
    need = closest["memory_per_gpu_bytes"] / MP.FIT_FAIL
    chips = sorted((c for c in hardware.CHIPS.values() if c.capacity_bytes >= need), key=lambda c: c.capacity_bytes)
    nodes = None
    for k in (2, 4, 8, 16):
        bigger = profile.model_copy(update={"cluster": profile.cluster.model_copy(
            update={"nodes": profile.cluster.nodes * k})})
        big_batch = batch * k if batch % global_batch(profile) == 0 else batch
        if any(M.total_bytes(memory_plan(bigger, lay)) / capacity <= MP.FIT_FAIL
               for lay in layouts(bigger, big_batch)):
            nodes = profile.cluster.nodes * k
            break
    return {"closest": closest, "shortfall_bytes": closest["memory_per_gpu_bytes"] - MP.FIT_FAIL * capacity,
            "larger_gpu": chips[0].name if chips else None, "nodes_that_fit": nodes,
            "uses_full_recompute": closest["activation_recompute"] == "full"}


def profile_with(profile: Profile, lay: dict, step_compute_s: float | None = None) -> dict:
    """The profile as a plain dict with its ``training`` layout replaced by ``lay`` (an ``advise``
    candidate); ``step_compute_s`` the predicted compute of that layout. Validated by the caller."""
    d = profile.model_dump()
    t = d["training"]
    t.update(tp=lay["tp"], pp=lay["pp"], zero_stage=lay["zero_stage"], activation_recompute=lay["activation_recompute"],
             sequence_parallel=lay["sequence_parallel"], micro_batch_size=lay["micro_batch_size"],
             microbatches=lay["microbatches"], interleave=lay["interleave"], ep=lay.get("ep", 1), cp=lay.get("cp", 1),
             pipeline_schedule="interleaved" if lay["interleave"] > 1 else "1f1b")
    if step_compute_s is not None:
        t["step_compute_s"] = float(f"{step_compute_s:.4g}")
    return d


def write_profile(profile: Profile, lay: dict, out: Path) -> Path:
    """Write the profile with ``lay`` as its plan (validated first: nothing is written if it fails)."""
    import yaml

    from preflight.core.fsutil import atomic_write_text
    from preflight.core.profile import parse_profile

    d = profile_with(profile, lay, lay["compute_s"])
    parse_profile(d, str(out))
    header = (f"# Written by `preflight advise`: the top layout (tp={lay['tp']}, pp={lay['pp']}, dp={lay['dp']}), "
              f"predicted {lay['tokens_per_s_per_gpu']:.4g} tokens/s per GPU, MFU {lay['mfu']:.1%}.\n")
    atomic_write_text(out, header + yaml.safe_dump(d, sort_keys=False))
    return out
