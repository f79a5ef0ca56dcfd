# %% [markdown]
# # Chapter 1: Baseline before scale
#
# **Pitfall:** scaling out before one device is understood. If one GPU runs at 30 % of its FLOP rate
# because GELU and LayerNorm (memory-bound) eat half the step, 512 GPUs run at 30 % too, plus
# communication. This chapter measures the *price list* of one device first, then asks what the
# serial part and the gradient traffic of **your** plan do to scaling.
#
# What it measures, live, on this machine's accelerator (or the CPU, labelled as such):
#
# 1. the ceilings of the machine: matmul rate, memory copy, host-to-device copy;
# 2. one training step of a reference Transformer on three layers at once: hardware (NVML),
#    framework (torch.profiler op categories), business (tokens/s); the step-time composition;
#    peak memory; FLOPs and MFU;
# 3. the memory-bound share, and the fix measured (torch.compile fuses those ops);
# 4. Amdahl and Gustafson with sliders, the serial share taken from the measurement;
# 5. staged data-parallel scaling measured with DDP (1 -> 2 processes here), extrapolated to your
#    8 / 64 / 512 / target GPUs, with the stop rule.
#
# **Time:** about 1 minute on a 2-core CPU (measured: 51-60 s in the audit; the first torch.compile is
# most of it). On a GPU node the sizes grow with the device, so expect a similar order (not timed on a
# GPU yet). With `plan_only = True` only the formulas run (about 10 s).

# %%
# parameters: the audit (papermill) overrides these; in JupyterLab edit them here.
profile_path = "../data/profiles/example.yaml"
findings_path = ""      # where the audit collects findings; empty: keep them in memory
plan_only = False       # True: formulas on the profile only, no live measurement
results_dir = ""        # folder of recorded measurements (e.g. from your cluster) to use instead
out_dir = ""            # the audit's output folder (records, charts)
quick = False           # smallest sizes (smoke test)
interactive = True      # show the sliders (the headless audit turns them off)
traces_dir = ""         # your job's torch.profiler traces (a folder, one file or more per rank); empty: the example

# %%
print("Loading the chapter's libraries (a few seconds) ..." if plan_only else
      "Loading the chapter's libraries, then PyTorch to probe the device (about 10 s) ...")

import os

import pandas as pd

from preflight.chapters import baseline as B
from preflight.core import hardware
from preflight.models import scaling
from preflight.reporting import charts
from preflight.runner.chapter import start

ch = start("baseline", profile_path, findings_path or None, plan_only, results_dir or None, out_dir or None,
           quick=quick)
prof = ch.profile
print(f"project {prof.project}: {prof.model.params / 1e9:g}B params, {prof.gpus} GPUs "
      f"({prof.cluster.nodes} nodes x {prof.cluster.gpus_per_node} {prof.cluster.gpu}), dp = {prof.dp}")
ch.announce()

# %% [markdown]
# ## 1. The ceilings of this machine
#
# A datasheet peak is what the chip could do; a **measured** ceiling is what this chip, driver and
# library deliver. Both are shown: MFU against the datasheet is the comparable number, MFU against the
# measured matmul rate tells how far the model is from what is reachable. Timings: warm-up, then the
# median of repeats, synchronised (CUDA events on a GPU).

# %%
from preflight.bench import ceilings

ceil = ch.measurement(ceilings.METHOD, lambda: ceilings.measure(ch.torch_device, quick=ch.quick))
if ceil:
    r = ceil.results
    rows = [("matmul", f"{r['matmul']['tflops']:.3g} TFLOP/s ({r['matmul']['dtype']}, n={r['matmul']['n']})"),
            ("memory copy", f"{r['memcopy']['GBps']:.3g} GB/s"),
            ("host-to-device", (f"pageable {r['h2d']['pageable_GBps']:.3g} GB/s, pinned {r['h2d']['pinned_GBps']:.3g} GB/s"
                                if r["h2d"].get("available", True) else r["h2d"]["reason"]))]
    ch.table(pd.DataFrame(rows, columns=["ceiling", ceil.source]))
if ch.gpu_key in hardware.CHIPS:
    print("Datasheet of the profile's GPU (dense TFLOP/s, GB/s, GB):")
    ch.table(hardware.table().loc[[ch.gpu_key]].reset_index())
else:
    print(f"GPU {ch.gpu_key or '(this machine)'} is not in the hardware table: MFU against a datasheet is left empty.")

# %% [markdown]
# ## 2. One training step, on three layers at once
#
# Any one layer alone misleads: GPU utilisation can read 100 % while the device busy-waits on the data
# loader; high occupancy can hide memory-bound kernels. So the reference step is seen as
#
# - **hardware**: NVML samples during the timed steps (GPU util, memory util, SM clock, power);
# - **framework**: torch.profiler self time per op, grouped into matmul / attention / memory-bound /
#   communication / data / optimizer / other;
# - **business**: samples and tokens per second.
#
# The step timer below (`preflight.core.timing.StepTimer`) is the one you can drop into your own loop: it
# splits each step into data wait / forward / backward / optimizer / other.
#
# **Your own model.** When the profile names a workload (`workload: entry: my_workload.py:build`, see
# the README), this section and the next two measure *it* instead of the reference Transformer: its
# own batches, loss and optimizer, its parameters counted exactly, the FLOPs of its step counted op by
# op, and torch.compile on its own forward and backward.

# %%
from preflight.bench import baseline as bench_baseline
from preflight.bench import workload_baseline as bench_wl

wl = ch.workload        # the profile's own model (preflight.core.workload), or None: the reference model
if wl:
    print(f"measuring {wl.label} from {wl.entry}, not the reference model")
    base = ch.workload_measurement(bench_wl.METHOD, lambda: bench_wl.measure_baseline(wl, ch.torch_device,
                                                                                       quick=ch.quick))
else:
    base = ch.measurement(bench_baseline.METHOD, lambda: bench_baseline.measure_baseline(ch.torch_device,
                                                                                         quick=ch.quick))
if base:
    r = base.results
    print(base.source)
    comp = bench_baseline.composition_frame(r)
    ch.table(pd.DataFrame({"phase": comp["phase"], "ms per step": comp["seconds"] * 1e3,
                           "share": comp["share"].map("{:.1%}".format)}))
    ch.show("step_composition", charts.share_bar(bench_baseline.composition_frame(r), "phase",
                                                 title="Step-time composition (median step)"))
    if r["categories"]:
        ch.show("op_categories", charts.share_bar(bench_baseline.categories_frame(r), "category",
                                                  title="Op categories (profiler self time)"))
    nv = r.get("nvml") or {"available": False, "reason": "not sampled"}
    print("NVML:", nv if nv.get("available") else f"not available ({nv.get('reason')})")

# %% [markdown]
# ## 3. FLOPs and MFU
#
# A Transformer training step costs about **6N + 12·L·h·s FLOPs per token** (N parameters without
# embeddings, L layers, h hidden size, s sequence length). `torch.utils.flop_counter` counts the real
# matmul FLOPs of one step; the two should agree closely. MFU = achieved model FLOP/s / peak FLOP/s.
# When the chip is not in the hardware table (a CPU, say) the datasheet MFU is **left empty** rather
# than guessed. For a workload the count is the measure (its FLOPs per sample), and the formula is shown
# beside it only where the model is a Transformer built from `torch.nn` attention layers.
#
# Two conventions hide in that formula. N: a **mixture-of-experts** model computes with its *active*
# parameters only, `N_active = N_total − L_moe (E − k) m_e` (DeepSeek-V3: 37B of 671B; `model.experts`,
# `preflight.models.moe`), so its FLOPs per token follow N_active while its memory follows N_total.
# Precision: an **fp8** run's matmuls can reach twice the bf16 peak (H100: 1,979 vs 989.5 dense
# TFLOP/s), and MFU is still stated against the bf16 peak by convention (`python -m preflight chips`
# lists both): say which peak when comparing.

# %%
if base and wl:
    ch.table(bench_wl.flops_table(base.results))
elif base:
    f, m = base.results["flops"], base.results["mfu"]
    ch.table(pd.DataFrame([
        {"quantity": "FLOPs per step, counted (FlopCounterMode)", "value": f"{f['counted_per_step']:.4g}"},
        {"quantity": "FLOPs per step, 6N + 12Lhs", "value": f"{f['formula_per_step']:.4g}"},
        {"quantity": "counted / formula", "value": f"{f['ratio_counted_to_formula']:.3f}"},
        {"quantity": "achieved TFLOP/s", "value": f"{m['achieved_tflops']:.4g}"},
        {"quantity": "MFU vs datasheet",
         "value": f"{m['mfu_datasheet']:.1%}" if m["mfu_datasheet"] is not None else m["peak_note"]},
        {"quantity": "MFU vs measured matmul ceiling", "value": f"{m['mfu_measured_ceiling']:.1%}"},
    ]))

# %% [markdown]
# ## 4. The memory-bound share, and the fix measured
#
# Elementwise ops, norms and activations move far more bytes than they compute: their speed is set by
# memory bandwidth, not FLOPs. On GPUs they often take a large share of the step (the field case:
# ~45 % in GELU and LayerNorm on a model planned for 512 GPUs). Adding GPUs does not shrink that share,
# it adds communication on top. The fix is **fusion**: `torch.compile` generates one kernel for a chain
# of elementwise ops, reading and writing memory once. Measured here on a Linear-GELU-add-LayerNorm
# block, eager vs compiled.

# %%
from preflight.chapters import exercises as X
from preflight.chapters.predict import ask, check

if ch.measure or results_dir:          # predict before the measurement below shows it
    ask(X.fusion(on_workload=bool(wl)))
prediction_fusion = None       # your answer

# %%
from preflight.bench import fusion as bench_fusion

if wl:       # torch.compile on the workload's own forward + backward: does fusion help *your* model?
    fus = ch.workload_measurement(bench_wl.FUSION, lambda: bench_wl.measure_fusion(wl, ch.torch_device,
                                                                                    quick=ch.quick))
else:
    fus = ch.measurement(bench_fusion.METHOD, lambda: bench_fusion.measure_fusion(ch.torch_device, quick=ch.quick))
if fus and fus.results.get("available"):
    fr = fus.results
    ch.show("fusion", charts.bars(pd.DataFrame({
        "version": ["eager", "torch.compile"],
        "ms per fwd+bwd": [fr["eager_fwd_bwd_s"] * 1e3, fr["compiled_fwd_bwd_s"] * 1e3]}),
        "ms per fwd+bwd", "version", title=f"Eager vs torch.compile, ms per forward + backward ({fus.source})"))
    cats = bench_fusion.categories_frame(fr).pivot(index="category", columns="version", values="share")
    cats = cats.reindex(columns=["eager", "compiled"]).rename_axis(columns=None)
    print("Share of profiled op time by category:")
    ch.table(cats[(cats > 0).any(axis=1)].map("{:.1%}".format).reset_index())
    for note in fr.get("notes", []):
        ch.note(note)
elif fus:
    print("torch.compile not available here:", fus.results.get("reason"))
measured_fusion = fus.results.get("speedup_fwd_bwd") if fus and fus.results.get("available") else None
if measured_fusion:
    check(X.fusion(measured_fusion, bool(wl)), prediction_fusion, reveal=not interactive)
if wl:
    from preflight.chapters import workload as W

    W.add_baseline_findings(ch.findings, prof, base, fus)
else:
    B.add_measured_findings(ch.findings, base, fus)

# %% [markdown]
# ## 5. Amdahl and Gustafson: what the serial part costs
#
# Step time T = Ts (serial: data waits, synchronisation points, evaluation barriers, logging) + Tc
# (parallelisable compute). The profile gives **one GPU's** step at the target layout.
#
# - **Strong scaling** (the global batch is fixed, the work is split N ways): **S(N) = (Ts + Tc) / (Ts +
#   Tc/N)**, never more than **1 + Tc/Ts** (Amdahl). The saying "10 % serial caps you at 10x" is this
#   law, and it is true when the 10 % is measured on the run you are splitting and the serial part does
#   not shrink.
# - **Weak scaling** (the per-GPU batch is fixed, as data-parallel pre-training usually runs): N GPUs do N
#   times the work per step; the serial share s measured at that scale costs the same fraction at every
#   N: **S(N) = N − s(N − 1)** (Gustafson). The field case's 10 % then costs ~10 % (about 920x at 1024 GPUs),
#   not 99 %.
#
# Both laws are one algebra: Amdahl's s is measured on one GPU, Gustafson's on N. `training.scaling`
# (weak by default) says which one describes the plan; that one carries the verdict, the other is shown
# as what the other policy would give: under weak scaling Amdahl's ceiling below is for reference (info).
#
# **Is the plan possible at all?** `baseline/implied_mfu` divides the FLOPs of one GPU's step
# ((6N + 12·L·h·s) × tokens / (tp·pp)) by its compute time and the chip's dense peak: over 100 % the
# plan's numbers cannot be true, over 60 % they beat published large runs.
#
# Field case: a team tuned communication for weeks to lift efficiency from 60 % to 75 %; the real serial
# point was a full validation pass at each epoch end (8 % of the time). Find the serial points first.
#
# The profile's numbers are audited below; the chart and the sliders start from the profile's step (this
# machine's measured step, forward + backward parallel, the rest serial, is printed beside it).

# %%
ts, tc, step_basis = B.chart_step(prof, ch.gpu_key)
law = ("Gustafson's (weak scaling: baseline/gustafson_speedup_at_target); Amdahl's ceiling is what a fixed "
       "global batch would give" if prof.training.scaling == "weak" else
       "Amdahl's (strong scaling: baseline/amdahl_speedup_at_target)")
print(f"The profile's step: serial {ts:.3g} s, parallel {tc:.3g} s ({step_basis}), Amdahl ceiling "
      f"{scaling.amdahl_ceiling(ts, tc):.3g}x. The verdict is {law}.")
ch.show("amdahl", charts.amdahl_chart(ts, tc, n_max=max(1024, prof.gpus), n_mark=prof.gpus, source="the profile's step"))
from preflight.bench import scaling as bench_scaling

stage_dir = os.path.join(ch.out_dir, "records", "scaling") if ch.out_dir else None
scal = ch.measurement_set(bench_scaling.METHOD, lambda: bench_scaling.measure_stages(stage_dir, quick=ch.quick))
stages = bench_scaling.stages_frame(scal.results["records"]) if scal else None
# recorded stages (your cluster's, --results) replace the model's points on the curve; this machine's do not
curve_measured = bench_scaling.measured_efficiencies(stages) if scal and scal.origin == "recorded" else None
curve = B.plan_curve(prof, curve_measured, ch.gpu_key)
B.add_plan_findings(ch.findings, prof, curve, ch.gpu_key)
if base:
    ts_m, tc_m = B.measured_serial_parallel(base.results["composition"])
    print(f"This machine's measured step: serial {ts_m * 1e3:.1f} ms, parallel {tc_m * 1e3:.1f} ms (serial share "
          f"{scaling.serial_fraction(ts_m, tc_m):.1%}, Amdahl ceiling {scaling.amdahl_ceiling(ts_m, tc_m):.3g}x): a "
          "different model on a different device, so a different ceiling. Type it into the sliders to compare.")
else:
    ts_m, tc_m = ts, tc

# %% [markdown]
# **Predict first.** Before the sliders: the questions below are on your own plan, each changed a little
# so that the chapter has not shown the answer. Write your prediction after `prediction_... =` and run
# the cell; the sliders then test your reasoning, and the end of the chapter computes the answer.

# %%
from preflight.chapters import exercises as X
from preflight.chapters.predict import ask, check

EX = X.baseline(prof)

# %%
ask(EX["amdahl"])
prediction_amdahl = None       # your answer

# %%
if interactive:
    from IPython.display import display

    from preflight.widgets import amdahl_explorer
    display(amdahl_explorer(ts, tc, prof.gpus, source="the profile's step (the chart's and the findings')"))
else:
    print("Sliders: open this chapter in JupyterLab (make lab).")

# %% [markdown]
# ## 6. Scale in stages: 1 -> 8 -> 64 -> 512 -> target
#
# Record throughput and efficiency at each stage and draw the curve. Inside a node GPUs talk over
# NVLink; across nodes over InfiniBand or Ethernet, 9-18x less bandwidth per GPU with one NIC each (more
# with shared NICs; the curve uses chapter 3's rail-aware all-reduce). If 8 GPUs
# give 95 % and 64 give 80 %, 512 will likely fall under 60 %: **stop** and fix communication and serial
# overhead first. Keep the per-GPU batch fixed (scale the data with the GPUs), or start-up and per-epoch
# overheads make the measured curve look artificially bad.
#
# Measured here: the reference model under real DistributedDataParallel, launched by torchrun (gloo on
# a CPU, NCCL on GPUs). On a 2-core CPU only 1 and 2 processes give meaningful timings. On your cluster,
# `slurm/scaling_stages.sbatch` records the same measurement at 8, 64 and 512 GPUs, and
# `--results DIR` puts those points on the curve in place of the model.

# %%
if stages is not None:
    print(scal.source)
    ch.table(stages)
B.add_measured_scaling(ch.findings, stages, scal.source if scal else "not measured",
                       judged=stages is not None and not str(stages["unit"].iloc[0]).startswith("processes"))
ch.table(B.curve_table(curve))
ch.show("scaling_curve", charts.scaling_curve_chart(curve, measured=curve[curve["efficiency_measured"].notna()]))

# %% [markdown]
# ## 7. Memory per GPU: will the plan fit?
#
# The first thing that breaks when a plan meets the cluster is memory: an out-of-memory error at the
# first step, or a plan that only fits with a pipeline depth that wrecks throughput. Per GPU, training
# holds (`preflight.models.memory`, sources in its docstring):
#
# - **model states**, in the layout of your framework (`training.framework`,
#   `preflight.models.states`). The saying is "16 bytes per parameter": 2 of weights, 2 of gradients and
#   12 of optimizer state (fp32 master copy, momentum, variance): 112 GB (104 GiB) for 7B before anything else.
#   That is the ZeRO paper's layout (Rajbhandari et al. 2020), which DeepSpeed still uses. **Megatron-LM**
#   accumulates gradients in fp32, so it keeps 2 + 4 + 12 = 18 bytes; its distributed optimizer
#   (`zero_stage: 1`) shards the 12, giving 6 + 12/d. **PyTorch FSDP2** with a bf16 `MixedPrecisionPolicy`
#   keeps fp32 sharded parameters (they double as the master copy), fp32 gradients and 8 bytes of Adam
#   state, all sharded (ZeRO-3). On top of that come the **gathered** bf16 parameters of the layer being
#   computed and the next one being prefetched. HSDP (`training.shard_group: node`) shards inside a node
#   and replicates across nodes. Tensor and pipeline parallelism divide the parameters by tp·pp.
# - **activations** kept for the backward pass (`preflight.models.activations`), times the
#   micro-batches a pipeline stage holds in flight. The saying is Korthikanti et al. 2022's
#   **s·b·h·(34 + 5·a·s/h)** bytes per layer. The 5·a·s/h part is the s×s attention scores, which the
#   paper's explicit attention keeps (`model.attention: math`). The default kernels on current GPUs
#   keep none: PyTorch's `scaled_dot_product_attention` (flash / memory-efficient / cuDNN),
#   FlashAttention and Transformer Engine keep q, k, v, the output and a·s·b fp32 softmax statistics,
#   and recompute the scores in backward (`attention: flash`, the default). That takes the example
#   from 97.6 to 17.6 GiB, and makes selective recompute pointless.
#   The layer's shape counts too. **SwiGLU** (Llama) has 3 matrices h×ffn where GELU has 2, and keeps
#   4 tensors of s·b·ffn instead of 2. **Grouped-query attention** (`model.kv_heads`) shrinks K and V
#   in parameters and, with flash kernels, in activations; an unfused (math) path expands them to all
#   heads first. **No dropout** (`model.dropout: 0`, Llama-style) keeps no 1-byte masks. Sequence
#   parallelism splits the rest over tp.
# - a stated **allowance** for the framework (CUDA context, workspaces, allocator fragmentation).
#
# The verdict compares the sum with the GPU's memory; when it does not fit, the cheapest change that
# does (ordered by what each costs in throughput) is the fix. A peer calculator, llm-analysis, gives
# 21.1 GiB of activations for the example's layers, against 17.6 here. Each difference is named in
# `docs/memory-vs-llm-analysis.md`: fp32 norm inputs, two extra flash tensors, logits counted twice.

# %%
from preflight.chapters import memory_plan as MP
from preflight.models.memory import TERM_LABELS

mem = MP.add_plan_findings(ch.findings, prof, ch.device if prof.cluster.gpu == "auto" else None)
if mem["terms"] is not None:
    mt = mem["terms"]
    ch.table(pd.DataFrame({"term": mt["term"].map(TERM_LABELS), "GiB": mt["GiB"].round(2), "formula": mt["formula"],
                           "source": mt["source"]}))
    ch.show("memory_terms", charts.memory_bars(mt, mem["capacity"], title="Memory per GPU of the plan"))
    if mem["cheapest"] is not None and mem["capacity"] and mt["bytes"].sum() > mem["capacity"]:
        cf = mem["cheapest"]
        print("Changes in order of their cost in throughput (cheapest first); the first that fits is the fix:")
        ch.table(cf[cf["order"] <= 12][["order", "change", "GiB", "fits", "cost"]])

# %%
ask(EX["model_states"])
prediction_model_states = None       # your answer

# %%
if interactive and mem["plan"] is not None:
    from IPython.display import display

    from preflight.widgets import memory_explorer
    display(memory_explorer(mem["plan"], mem["capacity"], prof.cluster.gpus_per_node, prof.gpus))

# %% [markdown]
# ### The planner against a measurement on this machine
#
# The formulas are only worth their accuracy. A small GPT model with exactly the layer structure the
# paper assumes (LayerNorm, one QKV projection, explicit attention with dropout on the probabilities,
# a 4h GeLU MLP) trains one step: the **model states** are summed tensor by tensor after an AdamW step
# (exact), and the **activations** are every tensor autograd saves for the backward pass, counted by a
# saved-tensor hook in 16-bit as the paper counts them. The same check runs on both attention paths
# (the explicit one and SDPA's flash kernel, which the CPU has too), for a GPT-style layer and a
# Llama-style one (SwiGLU, a quarter of the heads for K and V, no dropout). On a GPU the whole step's
# measured peak (`torch.cuda.max_memory_allocated`) is compared with the plan too.

# %%
from preflight.bench import memory as bench_memory

memm = ch.measurement(bench_memory.METHOD, lambda: bench_memory.measure_memory(ch.torch_device, quick=ch.quick))
if memm:
    r = memm.results
    print(memm.source, "-", ", ".join(f"{k}={v}" for k, v in r["config"].items() if isinstance(v, (int, float, str))))
    ch.table(pd.DataFrame(r["states"]))
    a = r["activations"]
    print(f"activations per layer: measured {max(a['per_layer_measured']):,} bytes, planned {a['per_layer_predicted']:,.0f} "
          f"bytes ({a['error']:+.2%})")
    ch.table(pd.DataFrame([{"path": name, **{k: x["config"][k] for k in ("attention", "mlp", "dropout")},
                            "kv_heads / heads": f"{x['config']['kv_heads'] or x['config']['heads']} / {x['config']['heads']}",
                            "planned bytes/layer": x["per_layer_predicted"],
                            "measured bytes/layer": max(x["per_layer_measured"]), "error": f"{x['error']:+.3%}"}
                           for name, x in r["paths"].items()]))
MP.add_validation_finding(ch.findings, memm)

# %% [markdown]
# ## 8. Which layout would pass: the advisor
#
# A verdict says the plan fails; the next question is which plan would pass and be fastest. The
# advisor (`python -m preflight advise PROFILE`, `preflight.chapters.advisor`) asks the chapters' own models:
# it enumerates every layout the cluster and the framework allow (tp dividing a node's GPUs and the
# heads, pp dividing the layers, dp the rest, the framework's ZeRO stages and recompute policies,
# sequence parallelism, micro-batch sizes and counts that keep the global batch, interleaving), keeps
# those whose memory fits the GPU, and ranks them by predicted tokens/s per GPU: the FLOPs at an
# efficiency (this chapter's measured MFU when there is one, else a GEMM efficiency model by chip and
# shape), the bubble, the exposed tensor-, pipeline- and data-parallel communication (per layer for
# ZeRO-3 / FSDP), recompute's extra forward. Your own plan is always placed in that ranking, with what
# the best layout changes and which part of the step it shrinks.
#
# Read the ranking as a shortlist to measure, not an answer: the model leaves out power caps, the
# network's congestion and the framework's overheads. On 34 published runs (Megatron-LM, Megatron-Core,
# MosaicML, torchtitan, DeepSpeed ZeRO-3) its tokens/s per GPU is within 4.8 % of the published figure
# at the median and within 20 % on 30 of them (`docs/advisor-validation.md` shows each run and says why
# it ranks some layouts above the published ones). The sliders show how the order moves: with faster
# kernels the communication has less compute to hide behind; a team that cannot run deep pipelines or
# full sharding sees what it costs.

# %%
from preflight.chapters import advisor

advice = B.layout_advice(prof, ch.findings, ch.gpu_key if prof.cluster.gpu == "auto" else None,
                         mem["capacity"] if prof.cluster.gpu == "auto" else None)
if isinstance(advice, str):
    print(f"No ranking: {advice}")
else:
    print(f"{len(advice['candidates']):,} layouts, {advice['fitting']:,} fit; global batch {advice['global_batch']:,} "
          f"sequences.\nKernel efficiency: {advice['efficiency']:.0%} of the peak while computing "
          f"({advice['efficiency_source']}).\nMFU counts the whole step, so it is lower: the serial part, exposed "
          "communication, the bubble and recompute's extra forward take their share.")
    implied = next((f.value for f in ch.findings.findings if f.id == "baseline/implied_mfu"), None)
    if gap := advisor.efficiency_gap(implied, advice["efficiency"]):
        print(gap)
    ch.table(advisor.table(prof, advice["candidates"], top=5))
    fits = [c for c in advice["candidates"] if c["fits"]]
    ch.show("layouts", charts.layouts_chart(fits[:8], advisor.own_plan(prof, advice["candidates"]),
                                            advice["efficiency"]))

# %%
if interactive and not isinstance(advice, str) and advice["fitting"]:
    from IPython.display import display

    from preflight.widgets import layout_explorer
    display(layout_explorer(prof, advice))

# %% [markdown]
# ## 9. fp8: the real gain, by recipe
#
# **The saying:** "fp8 doubles throughput". The fp8 peak is twice the bf16 one on Hopper and Blackwell
# (H100 SXM: 1,979 vs 989.5 dense TFLOP/s), so one large GEMM whose operands are already in fp8 does run
# about 2x faster. **The measured truth** is far below: torchtitan's Float8 on Llama 3.1 8B (H100, FSDP +
# torch.compile) went from 6,667 to 8,532 tokens/s per GPU, **+28 %** (+29 % on 128 GPUs); Megatron-Bridge's
# DeepSeek-V3 tables give **1.13-1.28x** from BF16 to FP8. Why, in the step model's terms:
#
# - only the linear layers' three GEMMs (forward, input gradient, weight gradient) run in fp8; attention's
#   batched matmuls, norms, activations, communication and the serial part stay as they were: Amdahl on
#   the GEMMs' share of the step; and fp8 shortens a GEMM's math, not its shape's overhead (memory traffic,
#   tile edges): 1.67x at h = 4,096, 1.89x at h = 16,384;
# - communication that hid behind the bf16 compute can show once the compute is shorter: a step bound by
#   its gradient reduction gains little from fp8 (the table's "exposed comm" column);
# - every GEMM operand is first cast to fp8, a memory-bound pass whose bytes depend on the **recipe**:
#   delayed scaling (Transformer Engine) takes the amax from history, current scaling (torchao's tensorwise
#   and rowwise) reads the tensor once more for it, blockwise (DeepSeek-V3) and MXFP8 (Blackwell only)
#   write a scale per block in the same pass.
#
# So 2x holds for GEMMs alone, at large shapes, with their inputs already quantised. The table times your
# plan three ways with the one step model (`preflight.chapters.fp8_recipes`): bf16, fp8 GEMMs without the
# casts, fp8 with the recipe's casts. Predict first.

# %%
ask(EX["fp8"])
prediction_fp8 = None       # your answer

# %%
from preflight.chapters import fp8_recipes as F8

fp8_plan, fp8_words = F8.fp8_subject(prof, ch.gpu_key)
print(f"Timed by the step model on {fp8_words}.")
ch.table(F8.display_table(fp8_plan, ch.gpu_key))
print(F8.why(F8.recipe_row(fp8_plan, fp8_plan.training.fp8_recipe, ch.gpu_key)))
print("Measured, bf16 -> fp8 on the same layout (tokens/s per GPU):")
ch.table(F8.measured_table()[["run", "bf16", "fp8", "gain", "source"]])

# %%
if interactive:
    from IPython.display import display

    from preflight.widgets import fp8_explorer
    display(fp8_explorer(fp8_plan, ch.gpu_key))
else:
    print("Sliders: open this chapter in JupyterLab (make lab).")

# %% [markdown]
# ## Check your predictions
#
# The questions you answered before the sliders, computed with the library on your plan: how far off
# were you? The answer stays hidden until you predict (the headless audit shows it).

# %%
check(EX["amdahl"], prediction_amdahl, reveal=not interactive)

# %%
check(EX["model_states"], prediction_model_states, reveal=not interactive)

# %%
check(EX["fp8"], prediction_fp8, reveal=not interactive)

# %% [markdown]
# ## Your job's traces
#
# Everything above measures a model Preflight runs itself. A team that already trains at scale has
# better evidence: a few steps of `torch.profiler` on every rank of its real job (schedule `wait=1,
# warmup=1, active=3`, `record_shapes=True`, `prof.step()` each step). Set `traces_dir` to that folder
# (one file or more per rank); left empty, the embedded example job is shown (two ranks of a 128-GPU
# job, from Holistic Trace Analysis's test data).
#
# The window is HTA's: every `ProfilerStep` but the last, and the GPU work launched in them. **GPU
# idle** is the share of the GPU's span with no kernel, copy or memset running; *host-bound* idle means
# the GPU waited for the CPU to launch the next kernel (small kernels, Python overhead: `torch.compile`,
# CUDA graphs, a larger micro-batch), *queued* means work was waiting on something else
# (synchronisation, another device). Where the trace recorded shapes, the matmul, convolution and
# attention FLOPs give the achieved TFLOP/s and MFU against the chip's dense peak. The trace-quality
# table says what each file can support, and why not. The command line gives the same verdicts in
# seconds: `python -m preflight traces DIR`.

# %%
from preflight.runner.trace_section import show_traces

job_traces = show_traces(ch, traces_dir, example=interactive)

# %% [markdown]
# **The plan against the traces.** The step model predicts each term of your plan's step (section 4's
# `baseline/step_model`); the traces measure the same kinds of time in the job that ran. Where they part,
# the plan's numbers are not your job's: the largest difference is named first, with the chapter that
# explains it. A job traced at another scale or on another chip than planned is said so beside the table.

# %%
from preflight.chapters import plan_vs_trace as PVT

pvt = PVT.compare(prof, job_traces, ch.gpu_key) if job_traces else None
if pvt is not None:
    ch.table(PVT.table(pvt))
    ch.show("plan_vs_trace", PVT.chart(pvt))
    for line in pvt["differences"]:
        print("Not the planned job:", line)
    if traces_dir:             # the team's own traces join the findings; the embedded example teaches only
        PVT.add_finding(ch.findings, pvt, f"the plan's step model beside the traces in {traces_dir}")
elif job_traces:
    print("No plan-vs-trace table: the plan has no step model (the GPU's peak is unknown) or the traces no steps.")

# %% [markdown]
# ## Findings of this chapter

# %%
ch.table(ch.findings.frame()[["id", "value", "unit", "verdict", "threshold", "message"]])

# %% [markdown]
# ## What you learned
#
# - **Measure one device first.** Its measured ceilings, not the datasheet's; where a step's time goes
#   (NVML, profiler op categories, tokens/s); MFU against the chip's peak.
# - **Memory-bound ops do not shrink with more GPUs.** Elementwise ops and norms are paced by memory
#   bandwidth; fusion (`torch.compile`) is their fix.
# - **The serial part caps strong scaling** at 1 + Tc/Ts (Amdahl); with the per-GPU batch fixed it costs
#   its share at every scale (Gustafson). Find the serial points before tuning communication.
# - **Scale in stages**, 1 → 8 → 64 → 512 → target, and stop where efficiency falls under 60 %.
# - **Memory per GPU** is model states (16–18 bytes per parameter before ZeRO) + activations × the
#   micro-batches in flight + an allowance; the cheapest change that fits decides tp, pp and ZeRO.

# %%
ch.next_steps()

# %% [markdown]
# Levers this chapter measured: remove serial work from the step (validation passes, synchronous
# logging, data waits), compile the memory-bound blocks, and take tp / pp / ZeRO / recompute from the
# memory plan before the first run on the cluster.
#
# **Next chapter** (the playbook's order, 1 → 3 → 2 → 4 → 5: communication builds on this chapter's price
# list): [Chapter 3: communication vs computation →](03_communication.ipynb).
# All chapters: [README](README.md); terms: [glossary](glossary.md).
