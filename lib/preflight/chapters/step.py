"""One model of the plan's step: the home of every plan-side number that depends on the step.

Every chapter's plan verdicts, ``check``, ``audit --plan-only`` and ``advise``'s ``plan`` read the step of
the profile's own layout from here, so the same term has the same figure everywhere. The model is
``preflight.models.throughput.step_time`` (calibrated on published runs: docs/advisor-validation.md); this
module turns a profile into its inputs and names its terms. One GPU's step, in seconds::

    step = serial + compute + bubble + tp_exposed + cp_exposed + all_to_all + pp_comm + dp_exposed

- ``compute``: the slowest stage's FLOPs at the GEMM efficiency (``throughput.gemm_efficiency``, chip and
  shapes), every micro-batch; recompute's extra forward included;
- ``bubble``: the pipeline's idle slots, ``(p - 1) / v`` of the slowest stage's micro-batch (1F1B and
  interleaved; the chapters' closed form ``(p-1)/(v m)`` is this term over ``compute``);
- ``tp_exposed`` / ``cp_exposed`` / ``all_to_all`` / ``pp_comm``: the tensor-, context-, expert- and
  pipeline-parallel communication that compute does not hide;
- ``dp_exposed``: the data-parallel traffic (the ring formula's bytes, by ZeRO stage: an all-reduce,
  reduce-scatter + all-gather, or ZeRO-3's per-layer collectives; dense weights over dp x cp, routed
  experts over their expert-data-parallel group) that the framework's overlap does not hide;
- ``serial``: ``training.step_serial_s`` (data waits, barriers, logging).

**No invented step.** ``training.step_compute_s`` is the team's own figure: when the profile states it, the
prediction stands beside it and their ratio is judged (:func:`stated_ratio`); when it does not, the
chapters use the predicted compute and say so. The stated figure never replaces the model's terms: the
verdicts on communication, bubble and efficiency are the model's, so ``check`` and ``advise`` agree.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from preflight.core import hardware
from preflight.core.profile import Profile
from preflight.models import throughput as T

# The terms that add up to the step, in the order a step is drawn (bottom to top), with their words.
TERMS = (("serial_s", "serial (data wait, barriers, logging)"), ("compute_s", "compute"),
         ("bubble_s", "pipeline bubble"), ("tp_exposed_s", "tensor-parallel comm. (exposed)"),
         ("cp_exposed_s", "context-parallel comm. (exposed)"), ("a2a_s", "expert all-to-all"),
         ("pp_comm_s", "pipeline send/recv"), ("dp_exposed_s", "data-parallel comm. (exposed)"))
EXPOSED_COMM = ("tp_exposed_s", "cp_exposed_s", "a2a_s", "pp_comm_s", "dp_exposed_s")
# A stated compute this far from the model's says something the model does not see (or a wrong figure).
STATED_RATIO_WARN, STATED_RATIO_FAIL = 1.3, 2.0
EFFICIENCY_MODEL = ("the GEMM efficiency model by chip and shape, calibrated on published runs "
                    "(docs/advisor-validation.md)")


def model_of(profile: Profile) -> T.Model:
    """The profile's model as the step model sees it (fp8: the chip's fp8 peak over its bf16 peak)."""
    m = profile.model
    chip = hardware.lookup(profile.cluster.gpu) if profile.cluster.gpu != "auto" else None
    fp8 = profile.training.fp8 and chip is not None and chip.fp8_tflops
    speedup = T.fp8_gain(profile.cluster.gpu, chip.fp8_tflops, chip.bf16_tflops) if fp8 else 1.0
    return T.Model(params=m.params, layers=m.layers, hidden=m.hidden, seq_len=m.seq_len, vocab=m.vocab,
                   ffn_hidden=m.ffn_hidden, causal_flash=m.attention == "flash", matmul_speedup=speedup,
                   fp8_recipe=profile.training.fp8_recipe if fp8 else None, swiglu=m.mlp == "swiglu",
                   experts=m.expert_spec, heads=m.n_heads, kv_heads=m.n_kv_heads, qk_head_dim=m.qk_head_dim,
                   v_head_dim=m.v_head_dim, a2a_overlap=profile.training.moe_a2a_overlap,
                   dispatch_fp8=profile.training.moe_dispatch_fp8, node_limit=profile.training.moe_node_limit,
                   q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank, qk_rope_head_dim=m.qk_rope_head_dim)


def cluster_of(profile: Profile, gpu_key: str | None) -> T.Cluster:
    """The cluster as the step model sees it; ValueError when the GPU has no known bf16 peak."""
    peak = hardware.peak_tflops(gpu_key, "bf16")
    if peak is None:
        raise ValueError(f"cluster.gpu = {profile.cluster.gpu!r}: no known bf16 peak, so no compute time; "
                         "name a GPU of `python -m preflight chips`")
    c = profile.cluster
    return T.Cluster(peak_tflops=peak, gpus_per_node=c.gpus_per_node, intra_node_GBps=c.intra_node_GBps,
                     inter_node_Gbps=c.inter_node_Gbps, nics_per_node=profile.nics_per_node, chip=gpu_key,
                     in_network=c.in_network, nvlink_domain=c.nvlink_domain,
                     memory_GBps=(hardware.lookup(gpu_key).memory_GBps if hardware.lookup(gpu_key) else None))


def overlap_of(profile: Profile) -> T.Overlap:
    """The profile's overlap switches, each left empty taking the framework's default
    (``throughput.framework_overlap``)."""
    t = profile.training
    d = T.framework_overlap(t.framework)
    pick = (lambda mine, default: default if mine is None else mine)
    return T.Overlap(tp_comm=pick(t.tp_comm_overlap, d.tp_comm), grad_reduce=pick(t.overlap_grad_reduce, d.grad_reduce),
                     param_gather=pick(t.overlap_param_gather, d.param_gather))


def layout_of(profile: Profile, gpus: int | None = None) -> T.Layout:
    """The profile's own layout (at ``gpus`` GPUs: dp scaled, the per-GPU batch kept)."""
    t = profile.training
    dp = (gpus or profile.gpus) // (t.tp * t.pp * t.cp)
    return T.Layout(tp=t.tp, pp=t.pp, dp=dp, zero_stage=t.zero_stage, activation_recompute=t.activation_recompute,
                    sequence_parallel=t.sequence_parallel, micro_batch_size=t.micro_batch_size,
                    microbatches=t.microbatches, interleave=t.interleave if t.pipeline_schedule == "interleaved" else 1,
                    ep=t.ep, cp=t.cp, etp=t.etp, recompute_modules=recompute_modules(profile, t.activation_recompute))


def recompute_modules(profile: Profile, recompute: str) -> tuple[str, ...] | None:
    """The profile's Megatron recompute modules for a layout with ``recompute`` (None: not selective, or
    Megatron's default, core_attn)."""
    mods = profile.training.recompute_modules
    return tuple(mods) if recompute == "selective" and mods is not None else None


def time_layout(profile: Profile, lay: T.Layout, cluster: T.Cluster, efficiency: float | None = None,
                model: T.Model | None = None) -> T.StepTime:
    """``throughput.step_time`` of ``lay`` with the profile's model (or ``model``, a variant of it), dtype,
    serial part, overlap and framework."""
    return T.step_time(lay, model=model or model_of(profile), cluster=cluster, efficiency=efficiency,
                       grad_dtype=profile.training.grad_dtype, serial_s=profile.training.step_serial_s,
                       overlap=overlap_of(profile), framework=profile.training.framework,
                       shard_gpus=profile.cluster.gpus_per_node if profile.training.shard_group == "node" else None)


@dataclass(frozen=True)
class PlanStep:
    """The plan's step: the model's terms (the kernels at ``EFFICIENCY_MODEL``'s share of the peak) and the
    team's stated compute."""
    terms: dict                     # throughput.StepTime.as_dict() of the profile's layout
    stated_compute_s: float | None  # one GPU's compute per step as the profile states it; None: not stated

    @property
    def step_s(self) -> float:
        return self.terms["step_s"]

    @property
    def predicted_compute_s(self) -> float:
        return self.terms["compute_s"]

    @property
    def compute_s(self) -> float:
        """The compute the chapters' formulas use: the team's stated figure where given, else the model's."""
        return self.predicted_compute_s if self.stated_compute_s is None else self.stated_compute_s

    @property
    def compute_basis(self) -> str:
        return ("stated (training.step_compute_s)" if self.stated_compute_s is not None else
                f"predicted by the step model at {self.terms['efficiency']:.0%} of the bf16 peak ({EFFICIENCY_MODEL})")

    @property
    def exposed_comm_s(self) -> float:
        return sum(self.terms[k] for k in EXPOSED_COMM)

    @property
    def scaling_efficiency(self) -> float:
        """The share of the step that is work: (serial + compute) / step; the rest is bubble and exposed
        communication, what scaling out added."""
        return (self.terms["serial_s"] + self.terms["compute_s"]) / self.step_s

    def term_list(self) -> list[tuple[str, str, float]]:
        """(key, words, seconds) of each term, in drawing order; they add up to ``step_s``."""
        return [(k, w, self.terms[k]) for k, w in TERMS]

    def words(self) -> str:
        """'0.734 s = 0.09 serial + 0.406 compute + ...' (the non-zero terms)."""
        parts = " + ".join(f"{v:.3g} {w.split(' (')[0]}" for _, w, v in self.term_list() if v > 0)
        return f"{self.step_s:.3g} s = {parts}"


def stated_compute(profile: Profile) -> float | None:
    """One GPU's stated compute at the target layout (strong scaling: the stated work shared by every GPU)."""
    t = profile.training
    if t.step_compute_s is None:
        return None
    return t.step_compute_s / (profile.gpus if t.scaling == "strong" else 1)


def plan_step(profile: Profile, gpu_key: str | None = None) -> PlanStep | None:
    """The step of the profile's layout at its target, the kernels at the GEMM efficiency model's share of the
    peak; None when the GPU has no known peak (``gpu: auto`` on a machine without one): nothing to predict."""
    key = gpu_key or (None if profile.cluster.gpu == "auto" else profile.cluster.gpu)
    if hardware.peak_tflops(key, "bf16") is None:
        return None
    st = time_layout(profile, layout_of(profile), cluster_of(profile, key))
    return PlanStep(terms=st.as_dict(), stated_compute_s=stated_compute(profile))


class NoStepError(ValueError):
    """Neither a stated step nor a predicted one: no ``training.step_compute_s`` and no known GPU peak."""


NO_STEP = ("training.step_compute_s is not set and the GPU has no known peak (cluster.gpu: auto on a machine "
           "without one), so there is no step to judge: state one GPU's measured compute per step, or name the GPU")


def gpu_step(profile: Profile, gpu_key: str | None = None) -> tuple[float, float, str]:
    """(serial, compute, basis) of one GPU's step at the target layout: the stated compute where given,
    else the predicted one. :class:`NoStepError` when neither exists (no stated step, no known peak)."""
    ps = plan_step(profile, gpu_key)
    stated = stated_compute(profile)
    if ps is None and stated is None:
        raise NoStepError(NO_STEP)
    if ps is None:
        return profile.training.step_serial_s, stated, "stated (training.step_compute_s)"
    return profile.training.step_serial_s, ps.compute_s, ps.compute_basis


SLIDER_START_S = 1.0        # where the sliders start when the plan has no step: said on the chart, never judged


def slider_step(profile: Profile, gpu_key: str | None = None) -> tuple[float, float, str]:
    """(serial, compute, basis) for the charts, sliders and exercises: :func:`gpu_step`, else a nominal
    ``SLIDER_START_S`` of compute, labelled as such (no verdict reads it)."""
    try:
        return gpu_step(profile, gpu_key)
    except NoStepError:
        return profile.training.step_serial_s, SLIDER_START_S, f"a nominal {SLIDER_START_S:g} s ({NO_STEP})"


def stated_ratio(ps: PlanStep) -> float | None:
    """Stated compute over the model's predicted compute (None when nothing is stated)."""
    return None if ps.stated_compute_s is None else ps.stated_compute_s / ps.predicted_compute_s


def explain_gap(ps: PlanStep) -> str:
    """Which terms could explain a stated compute longer than the model's (the measured step mixes them)."""
    gap = ps.stated_compute_s - ps.predicted_compute_s
    candidates = [(w, v) for k, w, v in ps.term_list() if k not in ("compute_s",) and v > 0]
    said = ", ".join(f"{w} {v:.3g} s" for w, v in sorted(candidates, key=lambda x: -x[1]))
    return (f"The stated compute is {gap:.3g} s longer than the model's. A measured 'compute' often holds other terms "
            f"of the step: the model's are {said or 'none'}; a data wait or host-bound launches add more. The trace "
            "audit tells which (python -m preflight audit PROFILE --traces DIR: the plan-vs-trace table).")


def stage_curve(profile: Profile, gpu_key: str | None = None, measured: dict[int, float] | None = None):
    """The staged scaling curve (1 -> 8 -> 64 -> 512 -> target GPUs, ``models.extrapolate.stages``) of the
    profile's layout, each stage timed by the step model; None when the GPU has no known peak.

    A stage holds whole model-parallel groups (``tp pp cp``, and ``ep`` replicas for an MoE); smaller
    stages are left out. Weak scaling keeps the per-GPU batch; strong scaling keeps the global batch (each
    replica's micro-batches grow as the replicas shrink). Efficiency: the share of the step that is work,
    ``(serial + dp_n compute) / (dp_n step)`` under strong scaling (Amdahl with communication),
    ``(serial + compute) / step`` under weak. Columns as ``models.extrapolate.scaling_curve`` (the
    notebook, chart and report read them) plus the step and its bubble and exposed communication.
    Measured efficiencies (records) stand beside the model and decide where present."""
    import pandas as pd

    from preflight.models import comm
    from preflight.models.extrapolate import STOP_RULE_EFFICIENCY, stages

    key = gpu_key or (None if profile.cluster.gpu == "auto" else profile.cluster.gpu)
    if hardware.peak_tflops(key, "bf16") is None:
        return None
    t, c = profile.training, profile.cluster
    unit = t.tp * t.pp * t.cp
    fold = t.ep * (t.etp or t.tp)                  # MoE parallel folding: ep x etp divides tp x dp x cp
    first = unit * fold // math.gcd(fold, t.tp * t.cp)

    def whole(n: int) -> bool:
        return n % unit == 0 and (t.tp * (n // unit) * t.cp) % fold == 0

    ns = sorted({n for n in stages(profile.gpus) if whole(n)} | {first, profile.gpus} | set(measured or {}))
    cluster = cluster_of(profile, key)
    rows = []
    for n in ns:
        if not whole(n):
            continue
        lay = layout_of(profile, n)
        if t.scaling == "strong":
            m = t.microbatches * profile.dp / lay.dp
            if m != int(m):
                continue
            lay = T.Layout(**{**lay.__dict__, "microbatches": int(m)})
        st = time_layout(profile, lay, cluster).as_dict()
        dp_n = lay.dp if t.scaling == "strong" else 1
        work = st["serial_s"] + dp_n * st["compute_s"]
        no_ovl = st["step_s"] - st["dp_exposed_s"] + st["dp_comm_s"]
        hidden = st["step_s"] - st["dp_exposed_s"]
        ring = comm.allreduce_plan(profile.model.params, max(1, lay.dp * t.cp), t.grad_dtype, t.tp, t.pp,
                                   gpus_per_node=c.gpus_per_node, intra_node_GBps=c.intra_node_GBps,
                                   inter_node_Gbps=c.inter_node_Gbps, nics_per_node=profile.nics_per_node,
                                   compute_s=st["compute_s"], serial_s=st["serial_s"], in_network=c.in_network)
        eff = work / (dp_n * st["step_s"])
        meas = (measured or {}).get(n)
        rows.append({"gpus": n, "comm_s": st["dp_comm_s"], "flat_comm_s": ring.flat_s, "link": ring.link,
                     "busbw_GBps": ring.busbw_GBps, "step_s": st["step_s"], "step_s_no_overlap": no_ovl,
                     "step_s_overlap": hidden, "bubble_s": st["bubble_s"],
                     "exposed_comm_s": sum(st[k] for k in EXPOSED_COMM),
                     "efficiency_no_overlap": work / (dp_n * no_ovl), "efficiency_overlap": work / (dp_n * hidden),
                     "efficiency_model": eff, "efficiency_measured": meas,
                     "efficiency": meas if meas is not None else eff,
                     "source": "measured" if meas is not None else "step model",
                     "stop_rule": None if meas is None else ("stop" if meas < STOP_RULE_EFFICIENCY else "go on")})
    return pd.DataFrame(rows)


# The numbers a finding carries as ``terms`` (and `advise --json`'s plan has under the same names).
FINDING_TERMS = tuple(k for k, _ in TERMS) + ("step_s", "dp_comm_s", "dp_bytes", "tp_comm_s", "cp_comm_s",
                                              "efficiency", "mfu", "tokens_per_s_per_gpu")


def terms_of(ps: PlanStep) -> dict[str, float]:
    """The step's terms as a finding carries them (``FINDING_TERMS``)."""
    return {k: float(ps.terms[k]) for k in FINDING_TERMS}


def step_seconds(profile: Profile, gpu_key: str | None = None) -> tuple[float | None, str]:
    """One GPU's whole step (every term) and where it comes from: the step model's, else the stated compute
    plus the serial part (the GPU's peak unknown), else None."""
    ps = plan_step(profile, gpu_key)
    if ps is not None:
        return ps.step_s, "the plan's step model"
    stated = stated_compute(profile)
    if stated is None:
        return None, "no step: training.step_compute_s not set and the GPU's peak unknown"
    return stated + profile.training.step_serial_s, "the stated step (training.step_compute_s + step_serial_s)"


# The defaults that change a verdict when a profile leaves them empty: (section, field, what it changes).
VERDICT_DEFAULTS = (
    ("training", "step_serial_s", "the serial part of every step: Amdahl's ceiling, Gustafson's speedup, the step"),
    ("training", "step_compute_s", "none: the step model predicts the compute (baseline/step_model)"),
    ("training", "checkpoint_write_s", "C, the checkpoint's cost: the optimal interval and the expected waste"),
    ("training", "restart_s", "the time each failure costs: the expected waste"),
    ("training", "checkpoint_interval_s", "the plan's interval: its extra waste is not judged"),
    ("training", "step_jitter_cv", "the stragglers' cost: not judged"),
    ("cluster", "node_failure_per_day", "the failure rate (Llama 3's measured 3.78e-3): MTBF, interval, waste"),
    ("cluster", "intra_node_GBps", "NVLink bandwidth: tensor-parallel and in-node data-parallel time"),
    ("cluster", "inter_node_Gbps", "NIC bandwidth: data-parallel, pipeline and all-to-all time across nodes"),
    ("data", "length_median", "sample lengths (lognormal): the padding waste"),
    ("data", "length_sigma", "sample lengths (lognormal): the padding waste"),
)


def defaults_used(profile: Profile) -> list[tuple[str, object, str]]:
    """(field, the default used, what it changes) for each of :data:`VERDICT_DEFAULTS` the profile left empty."""
    out = []
    for section, name, what in VERDICT_DEFAULTS:
        sec = getattr(profile, section)
        if name not in sec.model_fields_set:
            if section == "data" and profile.data.lengths_file:
                continue                           # real lengths replace the lognormal
            out.append((f"{section}.{name}", getattr(sec, name), what))
    return out
