"""Chapter 3, communication vs computation: the plan's gradient traffic (``preflight.models.comm.
allreduce_plan``, the one home of bytes, link, times and bounds), the measured all-reduce sweep and
DDP overlap runs, and the layout rules of ``preflight.diagnose.topology``, as findings.
"""
from __future__ import annotations

import pandas as pd

from preflight.chapters import step as S
from preflight.core.findings import FindingSink, judge
from preflight.core.numfmt import factor
from preflight.core.profile import Profile
from preflight.models import comm
from preflight.models.extrapolate import STOP_RULE_EFFICIENCY

PROFILE_SOURCE = "computed from profile"

# Thresholds (one home). Communication / compute: what backward can hide (2/3 of compute) passes;
# more than the whole compute fails. Efficiency: the staged method's 80 % look / 60 % stop rule.
# Fit error: the alpha-beta model is good when it predicts within 25 %; beyond 50 % use the table.
EFFICIENCY_WARN = 0.80
FIT_WARN, FIT_FAIL = 0.25, 0.50
BUSBW_WARN, BUSBW_FAIL = 0.70, 0.40     # measured busbw / the bandwidth the profile assumes (GPUs only)
# Context parallelism: one K/V transfer over one ring step's attention. Above 1 the ring waits; 0.8 leaves
# room for kernel launch gaps and a slower step.
CP_RATIO_WARN, CP_RATIO_FAIL = 0.8, 1.0
# Exposed communication (every parallelism's, the step model's) over the step: 10 % is what tuned large runs
# leave (Llama 3, MegaScale); a quarter of the step is a plan that scales on communication, not compute.
EXPOSED_WARN, EXPOSED_FAIL = 0.10, 0.25


def allreduce_plan(profile: Profile, gpu_key: str | None = None) -> comm.AllreducePlan:
    """The ring formula for the profile's gradients (``preflight.models.comm.allreduce_plan``): every
    parameter's gradient all-reduced over the dp x cp replicas, against the step's compute (stated, else the
    step model's). The closed form the chapter teaches and its sliders move; the verdicts read the step
    model's data-parallel terms (:func:`plan`), which run it as the framework does."""
    m, c, t = profile.model, profile.cluster, profile.training
    serial_s, compute_s, _ = S.slider_step(profile, gpu_key)
    return comm.allreduce_plan(m.params, profile.replicas, t.grad_dtype, t.tp, t.pp, gpus_per_node=c.gpus_per_node,
                               intra_node_GBps=c.intra_node_GBps, inter_node_Gbps=c.inter_node_Gbps,
                               nics_per_node=profile.nics_per_node, microbatches=t.microbatches,
                               compute_s=compute_s, serial_s=serial_s, in_network=c.in_network)


def plan(profile: Profile, gpu_key: str | None = None) -> dict:
    """The ring formula's plan (bytes, placement, busbw, flat arithmetic, bounds) with the step model's
    data-parallel terms beside it, under ``step_*`` keys and as the verdicts' figures: ``dp_bytes`` (what each
    rank sends as the framework runs it), ``dp_comm_s``, ``dp_exposed_s``, ``step_s``, and ``step`` (the
    :class:`preflight.chapters.step.PlanStep`, None where the GPU's peak is unknown)."""
    p = allreduce_plan(profile, gpu_key).as_dict()
    ps = S.plan_step(profile, gpu_key)
    p["step"] = ps
    if ps is not None:
        st = ps.terms
        p.update(dp_bytes=st["dp_bytes"], dp_comm_s=st["dp_comm_s"], dp_exposed_s=st["dp_exposed_s"],
                 step_s=st["step_s"], exposed_comm_s=ps.exposed_comm_s, edp=st["edp_ranks"])
    return p


def closest_tier(profile: Profile) -> str:
    """The calculator's interconnect tier nearest the profile's NIC bandwidth (its starting position)."""
    from preflight.core.hardware import LINK_TIERS_GBps

    nic = comm.gbps_to_GBps(profile.cluster.inter_node_Gbps)
    return min(LINK_TIERS_GBps, key=lambda k: abs(LINK_TIERS_GBps[k] - nic))


def _scheme(profile: Profile) -> str:
    """How the plan's data-parallel traffic runs, in words (``throughput.step_time``'s cases)."""
    t = profile.training
    z = t.zero_stage
    how = {0: "a ring all-reduce of the gradients in 25 MB buckets, 2 (D-1)/D of them per rank",
           1: "a reduce-scatter of the gradients and an all-gather of the updated 16-bit weights, (D-1)/D of each "
              "(Megatron's distributed optimizer, DeepSpeed ZeRO-1)",
           2: "a reduce-scatter of the gradients on every micro-batch and one all-gather of the weights (DeepSpeed "
              "ZeRO-2)",
           3: "per layer and micro-batch an all-gather of its weights before forward and backward and a "
              "reduce-scatter of its gradients (ZeRO-3 / FSDP)"}[z]
    return how


def add_plan_findings(sink: FindingSink, profile: Profile, gpu_key: str | None = None) -> dict:
    """The plan's communication findings (the step model's terms, the ring formula beside them); returns the
    plan (:func:`plan`). With no step to judge (no stated compute, no known peak) each finding says so."""
    p = plan(profile, gpu_key)
    if p["step"] is None and S.stated_compute(profile) is None:
        for fid, unit in (("communication/allreduce_bytes_per_rank", "bytes"), ("communication/allreduce_s", "s"),
                          ("communication/comm_compute_ratio", "x"), ("communication/exposed_comm_share", "fraction"),
                          ("communication/efficiency_no_overlap", "fraction"),
                          ("communication/efficiency_full_overlap", "fraction")):
            sink.add(id=fid, value=None, unit=unit, verdict="info", threshold="not judged: no step", message=S.NO_STEP,
                     fix="Set training.step_compute_s, or name the GPU (cluster.gpu).", source=PROFILE_SOURCE)
        return p
    ps = p["step"]
    t = profile.training
    fix_comm = ("Overlap the data-parallel traffic with compute (DDP buckets; Megatron's --overlap-grad-reduce and "
                "--overlap-param-gather, off by default; FSDP2 prefetch), reduce bf16 gradients where the numerics "
                "allow (half the bytes), accumulate gradients (one reduction per k micro-batches), and keep each "
                "data-parallel group on its rails: one NIC per GPU, ranks placed tp-fastest so NCCL's rings cross "
                "each node once.")
    ring = (f"The ring formula for a plain all-reduce of every gradient, 2 x M/(tp pp) x (D-1)/D x "
            f"{comm.BYTES_PER_ELEMENT[t.grad_dtype]} B over D = {p['dp']}, gives {p['bytes_per_rank'] / 1e9:.3g} GB "
            f"in {p['time_s']:.3g} s ({p['link_why']}). The field report's flat arithmetic {p['flat_s']:.3g} s: "
            f"{p['flat_why']}.")
    if ps is None:                 # no peak: the ring formula on the stated compute is all there is
        bytes_, time_, exposed, compute, step = (p["bytes_per_rank"], p["time_s"], p["exposed_overlap_s"], p["compute_s"],
                                                 p["work_s"] + p["exposed_overlap_s"])
        basis, exposed_all = "the ring formula on the stated compute (the GPU's peak is unknown)", p["exposed_overlap_s"]
        src = PROFILE_SOURCE
    else:
        st = ps.terms
        bytes_, time_, exposed, compute, step = st["dp_bytes"], st["dp_comm_s"], st["dp_exposed_s"], st["compute_s"], st["step_s"]
        basis, exposed_all, src = "the plan's step model", ps.exposed_comm_s, "the plan's step model (preflight.chapters.step)"
    moe = (f" Dense weights reduce over dp x cp = {p['dp']} ranks, routed experts over their expert-data-parallel group "
           f"of {p.get('edp')} (tp dp cp / ep)." if profile.model.experts and ps is not None else "")
    sink.add(id="communication/allreduce_bytes_per_rank", value=bytes_, unit="bytes", verdict="info",
             threshold="recorded for reference",
             message=(f"Each data-parallel rank sends {bytes_ / 1e9:.3g} GB of {t.grad_dtype} gradients"
                      + (" and 16-bit weights" if t.zero_stage >= 1 else "") + f" per step: {_scheme(profile)}.{moe} "
                      + ring),
             fix=fix_comm, source=src)
    sink.add(id="communication/allreduce_s", value=time_, unit="s", verdict="info",
             threshold="recorded for reference",
             message=(f"Data-parallel traffic {time_:.3g} s per step ({basis}; rail-aware busbw "
                      f"{p['busbw_GBps']:.3g} GB/s, ring latency), of which {exposed:.3g} s is not hidden behind "
                      f"compute by the {t.framework} overlap settings."),
             fix=fix_comm, source=src)
    ratio = time_ / compute
    sink.add(id="communication/comm_compute_ratio", value=ratio, unit="x", verdict="info",
             threshold="recorded for reference (communication/exposed_comm_share judges what is left exposed)",
             message=(f"Data-parallel traffic {time_:.3g} s against {compute:.3g} s of compute per step: "
                      f"{factor(ratio)}." + (f" With {t.microbatches} accumulated micro-batches only the last one's "
                                             "backward can hide a once-per-step reduction." if t.microbatches > 1 else "")),
             fix=fix_comm, source=src)
    share = exposed_all / step
    v, words = judge(share, warn=EXPOSED_WARN, fail=EXPOSED_FAIL, higher_is_better=False, fmt="{:.0%}")
    parts = ("" if ps is None else " (" + ", ".join(f"{w} {ps.terms[k]:.3g} s" for k, w in S.TERMS
                                                     if k in S.EXPOSED_COMM and ps.terms[k] > 0) + ")")
    sink.add(id="communication/exposed_comm_share", value=share, unit="fraction", verdict=v,
             threshold=f"exposed communication / step: {words}",
             message=(f"{exposed_all:.3g} s of the {step:.3g} s step is communication that compute does not hide"
                      f"{parts or ''}: {share:.0%} ({basis})."),
             fix=(fix_comm if v != "pass" else "Nothing to do: compute hides the plan's communication."),
             source=src, terms=None if ps is None else {k: ps.terms[k] for k in S.EXPOSED_COMM})
    for fid, key, what in (("communication/efficiency_no_overlap", "no", "the data-parallel traffic after backward "
                            "(the lower bound: no overlap at all)"),
                           ("communication/efficiency_full_overlap", "full", "the data-parallel traffic fully "
                            "overlapped (the upper bound: perfect overlap; a real run lands between the two)")):
        # The two bounds are for reference: the verdict on efficiency is chapter 1's (the step model's,
        # baseline/scaling_efficiency_at_target); judging a bound here too counted one number twice.
        words = judge(None, warn=EFFICIENCY_WARN, fail=STOP_RULE_EFFICIENCY, fmt="{:.0%}")[1]
        if ps is None:
            eff = p["efficiency_no_overlap" if key == "no" else "efficiency_full_overlap"]
        else:
            work = st["serial_s"] + st["compute_s"]
            eff = work / (step - exposed + (time_ if key == "no" else 0.0))
        sink.add(id=fid, value=eff, unit="fraction", verdict="info",
                 threshold=f"a bound, recorded for reference (chapter 1 judges the model's estimate between them: {words})",
                 message=f"Scaling efficiency at {profile.gpus:,} GPUs with {what}: {eff:.0%} ({basis}).",
                 fix=fix_comm, source=src)
    if t.cp > 1:
        add_cp_finding(sink, profile)
    return p


def cp_exchange(profile: Profile, seq_len: int | None = None, cp: int | None = None):
    """The profile's context-parallel K/V exchange per layer (``preflight.models.context.exchange``) at its
    micro-batch, tp and GPU, attention at the GEMM efficiency model's share of the bf16 peak; None when the
    GPU's peak is unknown (``gpu: auto``, or a chip without one)."""
    from preflight.core import hardware
    from preflight.models import context, throughput

    m, c, t = profile.model, profile.cluster, profile.training
    s, k = seq_len or m.seq_len, cp or t.cp
    gpu = None if c.gpu == "auto" else c.gpu
    peak = hardware.peak_tflops(gpu, "bf16")
    if not peak:
        return None
    rate = peak * 1e12 * throughput.gemm_efficiency(gpu, m.hidden)
    link = throughput.neighbour_link(throughput.Cluster(peak_tflops=peak, gpus_per_node=c.gpus_per_node,
                                                         intra_node_GBps=c.intra_node_GBps,
                                                         inter_node_Gbps=c.inter_node_Gbps,
                                                         nics_per_node=profile.nics_per_node), t.tp * k)
    return context.exchange(t.micro_batch_size, s, m.hidden, m.n_heads, m.n_kv_heads, t.tp, k, *link,
                            rate, causal=m.attention == "flash")


def cp_table(profile: Profile, seq_lens=(8192, 32768, 131072), cps=(2, 4, 8, 16)) -> pd.DataFrame:
    """The K/V ring per layer for sequence lengths x cp at the profile's model, tp and links: chunk bytes,
    one transfer, one ring step's attention, their ratio (<= 1 hides), and Llama 3's all-gather variant."""
    rows = []
    for s in seq_lens:
        for k in cps:
            if s % (2 * k):
                continue
            x = cp_exchange(profile, s, k)
            if x is None:
                return pd.DataFrame()
            rows.append({"seq_len": s, "cp": k, "tokens per GPU": s // k, "K/V chunk (MB)": x.chunk_bytes / 1e6,
                         "transfer (us)": x.step_s * 1e6, "attention step (us)": x.attn_step_s * 1e6,
                         "transfer / attention": x.ratio, "ring exposed (ms)": x.ring_exposed_s * 1e3,
                         "all-gather (ms)": x.allgather_s * 1e3, "hides": x.ratio <= 1})
    return pd.DataFrame(rows)


def add_cp_finding(sink: FindingSink, profile: Profile) -> None:
    """``communication/cp_exchange``: does the context-parallel K/V ring hide behind attention?"""
    t, m = profile.training, profile.model
    x = cp_exchange(profile)
    if x is None:
        sink.add(id="communication/cp_exchange", value=None, unit="x", verdict="info", threshold="not judged",
                 message=f"cp={t.cp}: the GPU's peak is unknown (cluster.gpu = {profile.cluster.gpu}), so attention's "
                         "time per ring step is too.", fix="Name the GPU (cluster.gpu).", source=PROFILE_SOURCE)
        return
    v, words = judge(x.ratio, warn=CP_RATIO_WARN, fail=CP_RATIO_FAIL, higher_is_better=False, fmt="{:.2g}")
    where = "NVLink" if t.tp * t.cp <= profile.cluster.gpus_per_node else "the NICs"
    sink.add(id="communication/cp_exchange", value=x.ratio, unit="x", verdict=v,
             threshold=f"one K/V transfer / one ring step's attention: {words}",
             message=(f"cp={t.cp} at {m.seq_len:,} tokens: each GPU holds {m.seq_len // t.cp:,}; one ring step sends "
                      f"{x.chunk_bytes / 1e6:.3g} MB of K and V over {where} in {x.step_s * 1e6:.3g} us against "
                      f"{x.attn_step_s * 1e6:.3g} us of attention ({factor(x.ratio)}); exposed per layer "
                      f"{x.ring_exposed_s * 1e3:.3g} ms of {x.comm_s * 1e3:.3g} ms."),
             fix=("Fewer CP ranks for this length (the ratio grows as cp / s), CP ranks inside a node (tp x cp <= GPUs "
                  "per node), or grouped-query attention (smaller K and V)."),
             source="preflight.models.context (ring attention, Megatron-Core / Transformer Engine p2p)")


def sweep_busbw(profile: Profile, world_size: int, nodes: int) -> float:
    """The bus bandwidth the plan's link rule predicts for a sweep of ``world_size`` ranks on ``nodes``
    nodes (one group, spread evenly, alone on its nodes: it may use each node's NICs up to one per rank)."""
    c = profile.cluster
    k = max(1, world_size // max(1, nodes))
    place = comm.Placement(ranks_per_node=k, nodes=max(1, nodes), groups_per_node=1)
    return comm.allreduce_link(place, intra_node_GBps=c.intra_node_GBps, inter_node_Gbps=c.inter_node_Gbps,
                               gpus_per_node=k, nics_per_node=min(k, profile.nics_per_node)).busbw_GBps


def add_sweep_findings(sink: FindingSink, profile: Profile, sweep, why_missing: str = "plan-only mode") -> None:
    """``sweep``: a ``Measured`` whose results are an all-reduce record's results (or None)."""
    fit_words = judge(None, warn=FIT_WARN, fail=FIT_FAIL, higher_is_better=False, fmt="{:.0%}")[1]
    if sweep is None:
        sink.not_measured("communication/measured_busbw", "GB/s", "recorded for reference",
                      "Measure your interconnect: torchrun -m preflight.bench.allreduce", why_missing)
        sink.not_measured("communication/alpha_beta_fit_error", "fraction", fit_words,
                      "Use measured times per size rather than the model where the fit is poor.", why_missing)
        return
    r = sweep.results
    rows = pd.DataFrame(r["rows"])
    peak = rows.loc[rows["busbw_GBps"].idxmax()]
    gpu = r.get("backend") == "nccl"
    assumed = sweep_busbw(profile, r["world_size"], r.get("nodes", 1))      # what the plan predicts here
    share = float(peak["busbw_GBps"]) / assumed
    v, words = judge(share, warn=BUSBW_WARN, fail=BUSBW_FAIL, fmt="{:.0%}")
    if not gpu:
        v, words = "info", f"CPU processes over gloo, not judged; on GPUs, against the profile's bandwidth: {words}"
    sink.add(id="communication/measured_busbw", value=float(peak["busbw_GBps"]), unit="GB/s", verdict=v, threshold=words,
             message=(f"Peak bus bandwidth {peak['busbw_GBps']:.3g} GB/s at {peak['bytes'] / 1e6:.3g} MB "
                      f"(algbw {peak['algbw_GBps']:.3g} GB/s), {r['world_size']} ranks, {r.get('backend')} via "
                      f"{r.get('launcher', 'torchrun')}"
                      + (f"; the profile assumes {assumed:g} GB/s for this tier." if gpu else
                         " (processes on one host: memory copies, not a network).")),
             fix="Check NCCL's transport (NCCL_DEBUG=INFO: NET/IB with GPUDirect, not NET/Socket) and the "
                 "topology before tuning anything else.", source=sweep.source)
    fit = r["fit"]
    v, words = judge(fit["median_rel_error"], warn=FIT_WARN, fail=FIT_FAIL, higher_is_better=False, fmt="{:.0%}")
    if not gpu and sink.plan_gpu:      # gloo on this machine says nothing of the plan's links
        v, words = "info", f"CPU processes over gloo, unlike the plan's {sink.plan_gpu}: shown, not judged; {words}"
    sink.add(id="communication/alpha_beta_fit_error", value=fit["median_rel_error"], unit="fraction", verdict=v,
             threshold=f"median relative error: {words}",
             message=(f"alpha {fit['alpha_s'] * 1e6:.3g} us, bandwidth {fit['bandwidth_GBps']:.3g} GB/s; the model is "
                      f"off by a median {fit['median_rel_error']:.0%} (worst {fit['max_rel_error']:.0%}) over "
                      f"{len(rows)} sizes; small messages are where it errs."),
             fix="Trust the model for large buckets only; for small messages use the measured table.",
             source=sweep.source)


def overlap_table(rows: list[dict]) -> pd.DataFrame:
    """The overlap run's rows as a table in ms and MB."""
    df = pd.DataFrame(rows)
    from preflight.bench.overlap import CONFIG_LABELS

    out = pd.DataFrame({"configuration": df["config"].map(lambda c: CONFIG_LABELS.get(c, c)),
                        "step (ms)": df["step_s"] * 1e3,
                        "exposed comm (ms)": df["exposed_comm_s"] * 1e3,
                        "MB per step per rank": df["bytes_per_step_per_rank"] / 1e6,
                        "saving vs no overlap (ms)": df["saving_vs_no_overlap_s"] * 1e3})
    if "loss_rel_diff_vs_fp32" in df:
        out["loss vs fp32 (rel.)"] = df["loss_rel_diff_vs_fp32"]
    return out


def add_overlap_findings(sink: FindingSink, emulated, real, why_missing: str = "plan-only mode") -> None:
    """``emulated`` / ``real``: ``Measured`` overlap runs (or None). Savings come from the emulated
    device on a CPU (where real overlap cannot show), from the real run on GPUs."""
    run = real if real is not None and real.results.get("backend") == "nccl" else emulated
    if run is None:
        sink.not_measured("communication/overlap_saving", "fraction", "recorded for reference",
                      "DDP buckets (bucket_cap_mb) overlap the all-reduce with backward.", why_missing)
        sink.not_measured("communication/bf16_saving", "fraction", "recorded for reference",
                      "A bf16 compression hook halves the bytes.", why_missing)
        return
    by = {r["config"]: r for r in run.results["rows"]}
    label = "emulated device" if run.results.get("mode") == "emulated" else "real DDP"
    ref = by["manual_allreduce"]
    buckets = {k: v for k, v in by.items() if k.startswith("ddp_bucket_")}
    best_name = min(buckets, key=lambda k: buckets[k]["step_s"])
    ovl = buckets[best_name]
    saving = (ref["step_s"] - ovl["step_s"]) / ref["step_s"]
    sink.add(id="communication/overlap_saving", value=saving, unit="fraction", verdict="info",
             threshold="recorded for reference (> 0: overlap pays)",
             message=(f"{label}: all-reduce after backward {ref['step_s'] * 1e3:.1f} ms per step (exposed "
                      f"{ref['exposed_comm_s'] * 1e3:.1f} ms); best DDP bucketing ({best_name}) "
                      f"{ovl['step_s'] * 1e3:.1f} ms (exposed {ovl['exposed_comm_s'] * 1e3:.1f} ms, {saving:.0%} of the "
                      f"step saved); small / default / one huge bucket "
                      + " / ".join(f"{by[k]['step_s'] * 1e3:.1f}" for k in ("ddp_bucket_small", "ddp_bucket_default",
                                                                            "ddp_bucket_huge"))
                      + f" ms; no_sync over 4 micro-batches {by['ddp_no_sync_k4']['step_s'] * 1e3:.1f} ms per "
                        f"micro-batch (a quarter of the bytes)."),
             fix="Keep DDP's bucketing on (bucket_cap_mb ~25), accumulate with no_sync() where the batch allows.",
             source=run.source)
    ovl = by["ddp_bucket_default"]
    bf = by["ddp_bf16_hook"]
    saving = (ovl["step_s"] - bf["step_s"]) / ovl["step_s"]
    numerics = ""
    if real is not None:
        rb = {r["config"]: r for r in real.results["rows"]}["ddp_bf16_hook"]
        if rb.get("loss_rel_diff_vs_fp32") is not None:
            numerics = f" Numerics (real run): loss differs from fp32 by {rb['loss_rel_diff_vs_fp32']:.2e} (relative)."
    sink.add(id="communication/bf16_saving", value=saving, unit="fraction", verdict="info",
             threshold="recorded for reference (> 0: bf16 pays)",
             message=(f"{label}: bf16 gradients move {bf['bytes_per_step_per_rank'] / 1e6:.3g} MB instead of "
                      f"{ovl['bytes_per_step_per_rank'] / 1e6:.3g} MB per step per rank; step "
                      f"{ovl['step_s'] * 1e3:.1f} -> {bf['step_s'] * 1e3:.1f} ms ({saving:.0%})"
                      + ("; a difference this small is run-to-run noise on a shared CPU (the cast costs CPU "
                         "time; on a network link the halved bytes are the gain)." if abs(saving) < 0.10 else ".")
                      + numerics),
             fix="Register a bf16 compression hook (preflight.toolkit.hooks.bf16_compress_hook on any backend).",
             source=run.source)


def add_topology_finding(sink: FindingSink, profile: Profile) -> None:
    from preflight.diagnose import topology

    verdict, message = topology.layout_verdict(profile)
    sink.add(id="communication/topology", value=None, unit="", verdict=verdict,
             threshold="tensor-parallel groups inside a node; data-parallel groups aligned to nodes",
             message=message,
             fix="Keep tp <= GPUs per node (NVLink); let data parallelism span nodes; check NCCL's transport.",
             source=PROFILE_SOURCE)


NODES_SWEEP_CMD = "sbatch --nodes=2 slurm/torchrun_nodes.sbatch preflight.bench.allreduce --out results/"


def add_nodes_sweep_finding(sink: FindingSink, across, one=None,
                            why_missing: str = "no all-reduce record across nodes (measured on a cluster, "
                                               "read with --results)") -> None:
    """The all-reduce sweep across Slurm nodes (``across``: a recorded ``Measured`` or None) next to the
    single-node one (``one``, or None). Whether the "nodes" were separate machines is read from the
    record (every rank's host name): two Slurm nodes on one host exchange their bytes over loopback, and
    the sweep says nothing about a network; on a real cluster the same command measures the network."""
    fix = f"Measure the network between nodes: {NODES_SWEEP_CMD}"
    sink.measured("communication/measured_busbw_across_nodes", across, "GB/s", lambda r: _nodes_sweep(r, one, fix),
                  why_missing=why_missing, missing_fix=fix)


def _nodes_sweep(r: dict, one, fix: str) -> dict:
    rows = pd.DataFrame(r["rows"])
    peak = rows.loc[rows["busbw_GBps"].idxmax()]
    nodes, hosts = int(r.get("nodes", 1)), r.get("hosts") or []
    names = ", ".join(r.get("slurm_nodes") or []) or "?"
    msg = (f"Peak bus bandwidth {peak['busbw_GBps']:.3g} GB/s at {peak['bytes'] / 1e6:.3g} MB across {nodes} nodes "
           f"({names}) x {r.get('processes_per_node', 1)} process(es), {r['world_size']} ranks, {r.get('backend')}")
    if one is not None:
        single = pd.DataFrame(one.results["rows"])
        top = single.loc[single["busbw_GBps"].idxmax()]
        msg += (f"; on one node ({one.results['world_size']} ranks) {top['busbw_GBps']:.3g} GB/s at "
                f"{top['bytes'] / 1e6:.3g} MB: {peak['busbw_GBps'] / top['busbw_GBps']:.2g}x")
    if hosts and len(hosts) < nodes:
        msg += (f". The {nodes} Slurm nodes share one host ({', '.join(hosts)}): the bytes crossed loopback, not a "
                "network; on a real cluster the same command measures the network between nodes.")
    else:
        msg += f", on {len(hosts) or '?'} hosts: the network between them."
    return dict(value=float(peak["busbw_GBps"]), verdict="info", threshold="recorded for reference", message=msg,
                fix=fix)
