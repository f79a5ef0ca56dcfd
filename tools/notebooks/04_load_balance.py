# %% [markdown]
# # Chapter 4: Load balance
#
# **Pitfall:** some workers wait for others. Three places where it happens, each measured here:
#
# 1. **padding**: sequences of very different lengths padded to the longest, so most of the compute goes
#    to padding tokens; length bucketing fixes it;
# 2. **pipeline bubbles**: with p pipeline stages, the pipeline fills and drains at every step; the idle
#    share is **(p−1)/(v·m+p−1)** of the step (Narayanan et al. 2021; GPipe), not the popular (p−1)/(m·p);
#    zero-bubble schedules (ZB-H1) split the backward and cut it to about a third;
# 3. **unequal stages**: splitting layers by count when layers cost very different times; the slowest
#    stage sets the pace of the whole pipeline. Partition by **measured layer time**, exactly.
#
# Plus the straggler view: per-rank step times, and how much the slowest rank costs everyone.
#
# **Time:** about 2 minutes on a 2-core CPU (measured: 97 s in the audit; real
# torch.distributed.pipelining runs under torchrun). On a GPU node: not timed yet. `plan_only = True`:
# formulas on the profile only (seconds).

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
stragglers_dir = ""     # your job's per-op trace (*.parquet + meta*.yaml); empty: the shared case AR

# %%
print("Loading the chapter's libraries (a few seconds) ..." if plan_only else
      "Loading the chapter's libraries, then PyTorch to probe the device (about 10 s) ...")

import pandas as pd

from preflight.chapters import load_balance as C
from preflight.core.numfmt import percent, plural
from preflight.models import pipeline as P
from preflight.models import zerobubble as Z
from preflight.reporting import charts
from preflight.runner.chapter import start

ch = start("load_balance", profile_path, findings_path or None, plan_only, results_dir or None,
           out_dir or None, quick=quick)
prof = ch.profile
t = prof.training
print(f"project {prof.project}: pp={t.pp}, {plural(t.microbatches, 'micro-batch')}, {t.pipeline_schedule} schedule, "
      f"sequence length {prof.model.seq_len}")
ch.announce()

# %% [markdown]
# ## 1. Padding: how much of the compute goes to padding tokens
#
# Real corpora have long-tailed lengths (a few long documents, many short ones). Three ways to batch:
# pad every sample to the **longest in the dataset** (the naive fixed shape), to the **longest in its
# batch** (random batches: one long sample pads all the others), or **bucket by length** (batches of
# similar lengths). Below: the profile's lengths (a lognormal with its median and sigma, or your
# `data.lengths_file`), then the same three strategies measured as useful tokens/s of a real Transformer
# forward+backward on this machine. The sampler is `preflight.toolkit.sampling.LengthBucketSampler`.
#
# **Packing**, the usual pretraining answer, removes padding instead of shrinking it: concatenate samples
# into rows of exactly `seq_len` tokens. Cut samples at the row's end and only the last row has a tail;
# keep them whole and each row's tail is padding: next fit (close the row when the next sample does not
# fit) leaves about as much as bucketing, best fit decreasing almost none. The price is elsewhere:
#
# - **batch statistics change**: a batch is a fixed number of tokens holding a varying number of samples
#   (printed below), where a padded batch always holds the batch size;
# - **attention across document boundaries**: without a document mask (FlashAttention's varlen kernels
#   with `cu_seqlens`, FlexAttention's document mask) every token attends to the unrelated documents
#   before it in its row. Under a mask, restarting positions changes nothing with RoPE (it depends only on
#   relative offsets); it matters with absolute position embeddings. How much the mask matters is an
#   empirical question: Llama 3 reports limited impact in standard pre-training, and uses it for very
#   long sequences (Llama 3 paper, sec. 3.2);
# - **loss weighting**: the per-token mean over a packed batch weights each sample by its length; a
#   per-sample mean needs the document ids. Cut samples also lose their first piece as context.

# %%
pad_table = C.add_plan_findings(ch.findings, prof, profile_path, ch.gpu_key)
ch.table(pad_table.assign(waste=pad_table["waste"].map(percent)))   # percent, as the chart below
ch.show("padding_waste", charts.bars(pad_table.assign(**{"waste (%)": pad_table["waste"] * 100}), "waste (%)",
                                     "strategy", title="Padding waste (% of tokens computed)", fmt=".1f"))
pk = pad_table.attrs["packing"]
print(f"packed (samples cut at row ends): {pk['rows']} rows of {prof.model.seq_len} tokens; a batch of {C.PADDING_BATCH} "
      f"rows holds {pk['samples_per_batch_min']} to {pk['samples_per_batch_max']} samples (mean "
      f"{pk['samples_per_batch_mean']:.0f}), a padded batch always {C.PADDING_BATCH}; {pk['split_samples']} samples cut")

# %%
from preflight.bench import padding as bench_padding

padm = ch.measurement(bench_padding.METHOD, lambda: bench_padding.measure_padding(ch.torch_device, quick=ch.quick))
if padm:
    rows = pd.DataFrame(padm.results["rows"])
    print(padm.source, "-", ", ".join(f"{k}={v}" for k, v in padm.results["config"].items()
                                      if isinstance(v, (int, float, str))))
    shown = pd.DataFrame({"strategy": rows["strategy"].map(lambda s: bench_padding.STRATEGY_LABELS.get(s, s)),
                          "real tokens": rows["real_tokens"],
                          "padding tokens": rows["padded_tokens"], "waste": rows["waste"].map("{:.1%}".format),
                          "epoch (s)": rows["epoch_s"].round(3),
                          "useful tokens/s": rows["useful_tokens_per_s"].round(0).astype(int)})
    ch.table(shown)
    ch.show("padding_tokens_per_s", charts.bars(shown, "useful tokens/s", "strategy",
                                                title="Useful tokens/s (Transformer forward+backward)", fmt=",.0f"))

# %% [markdown]
# ## 2. The pipeline bubble: the right formula, and the wrong one
#
# With p stages and m micro-batches, the first stage starts micro-batch 1 while the others wait, and the
# last finishes alone: p−1 slots of fill and drain per step. Of the total time **(p−1)/(m+p−1)** is idle;
# interleaving v model chunks per GPU shrinks each slot by v: **(p−1)/(v·m+p−1)**. Relative to the ideal
# compute time the bubble is **(p−1)/(v·m)** (Narayanan et al. 2021 call this the bubble time fraction).
#
# The popular estimate **(p−1)/(m·p)** is wrong: it divides the p−1 fill/drain slots by p·m as if the
# step lasted p·m slots of one stage, mixing one stage's time with the whole pipeline's. For p=4, m=8
# it says 9.38 %; the truth is 3/11 = 27.3 % of the step. GPipe and 1F1B have the same bubble; 1F1B holds
# at most p micro-batches of activations on the first stage instead of m, which is what lets m grow.
#
# **How many micro-batches?** The rule of thumb m ≥ 4p comes from GPipe (Huang et al. 2019), where it
# made the bubble "negligible" against their measured speedups; in this formula it leaves
# (p−1)/(5p−1) = 16–20 % of the step idle (p=4: 15.8 %, p=8: 17.9 %). Under 10 % needs **m > 9(p−1)**
# (or interleaving, which divides the bubble by v). The chapter's verdict passes under 10 %.
#
# **Zero bubble.** Qi et al. 2023 ("Zero Bubble Pipeline Parallelism") split the backward into **B**,
# the gradient of a stage's input (the previous stage waits for it), and **W**, the gradient of its
# weights (only the optimizer needs it). Their ZB-H1 schedule sends B at once and runs each W later, in
# what would have been the drain bubble: stage i runs F[x], B[x−(p−1−i)], W[x−(p−1)] for x = 0, 1, ….
# Every stage holds at most p micro-batches, 1F1B's peak, and the bubble per stage drops from
# (p−1)(t_F+t_B+t_W) to **(p−1)(t_F+t_B−t_W)**: a third with equal times, **(p−1)/(3m+p−1)** of the step
# (p=4, m=8: 11.1 % against 27.3 %). The column and second chart below are simulated
# (`preflight.models.zerobubble`: every op waits for its stage and its inputs) with t_F = t_B = t_W; the
# simulation matches the paper's formula exactly when m ≥ p and W is the cheapest op. ZB-H2 and ZB-V,
# which remove the rest, need more memory or a V placement and are not simulated here.

# %%
grid = pd.DataFrame([{"p": p, "m": m, "share of step (p-1)/(m+p-1)": P.bubble_fraction(p, m),
                      "over ideal (p-1)/m": P.bubble_over_ideal(p, m), "wrong (p-1)/(m p)": P.wrong_bubble(p, m),
                      "interleaved v=2": P.bubble_fraction(p, m, 2) if m % p == 0 else float("nan"),
                      "zero bubble ZB-H1": Z.bubble_equal_times(p, m)}
                     for p in (2, 4, 8) for m in (4, 8, 16, 32)])
ch.table(grid.set_index(["p", "m"]).map(lambda x: "" if x != x else percent(x)).reset_index())   # as the text
print("(interleaved needs m to be a multiple of p: blank where it is not)")
gp, gm = (t.pp, t.microbatches) if t.pp > 1 else (4, 8)
gs, gv = (t.pipeline_schedule, t.interleave) if t.pp > 1 else ("1f1b", 1)
if gs == "interleaved" and gv == 1:
    gs = "1f1b"                     # one chunk per GPU: interleaving degenerates to 1F1B
    print("The profile says pipeline_schedule: interleaved with interleave: 1, one model chunk per GPU: that "
          "is 1F1B, drawn as 1F1B below. Set training.interleave to 2 or more to interleave.")
tl = P.schedule_timeline(gp, gm, gs, v=gv)
ch.show("schedule", charts.gantt(tl, title=("the profile's schedule" if t.pp > 1 else "example: 1F1B, p=4, m=8")
                                 + f": idle {P.timeline_bubble(tl):.1%} (formula {P.bubble_fraction(gp, gm, gv):.1%})"))
zb = Z.zb_h1_timeline(gp, gm)
ch.show("schedule_zero_bubble", charts.gantt(zb, title=f"ZB-H1, p={gp}, m={gm} (t_F = t_B = t_W, W: weight gradient): "
                                             f"idle {P.timeline_bubble(zb):.1%}"))

# %% [markdown]
# **Predict first.** Before the sliders: the questions below are on your own plan, each changed a little
# so that the chapter has not shown the answer. Write your prediction after `prediction_... =` and run
# the cell; the sliders then test your reasoning, and the end of the chapter computes the answer.

# %%
from preflight.chapters import exercises as X
from preflight.chapters.predict import ask, check

EX = X.load_balance(prof)

# %%
ask(EX["bubble"])
prediction_bubble = None       # your answer

# %%
ask(EX["bubble_m"])
prediction_bubble_m = None       # your answer

# %%
if interactive:
    from IPython.display import display

    from preflight.widgets import bubble_explorer
    display(bubble_explorer(gp, gm, gs, gv))
else:
    print("Sliders: open this chapter in JupyterLab (make lab).")

# %% [markdown]
# ### The memory side of the trade-off
#
# More micro-batches shrink the bubble, but what a stage must hold grows with them: GPipe runs all m
# forwards before any backward, so the first stage keeps the activations of **m** micro-batches; 1F1B
# starts backwards as soon as it can and keeps at most **p**; interleaving keeps a little more than p
# (Korthikanti et al. 2022). Below, for the profile's model at pipeline depth p, the bubble and the
# memory of the fullest stage from the same planner as chapter 1 (`preflight.models.memory`): only 1F1B
# lets m grow, and with it the bubble shrink, at constant memory.

# %%
from preflight.chapters import memory_plan as MP

mp = gp if t.pp > 1 else 4
bm = MP.bubble_memory_table(prof, mp)
if len(bm):
    ch.table(bm.assign(bubble=bm["bubble"].map(percent)).round(2))
    ch.show("bubble_memory", charts.curves(bm, "m", "activations (GiB)", "schedule", log_x=True, log_y=False,
                                           x_format="~g", x_title="micro-batches per step m",
                                           title=f"Activation memory of the fullest stage, p={mp} "
                                           f"({prof.model.params / 1e9:g}B model, micro-batch {t.micro_batch_size})"))
else:
    print(f"the planner cannot split {prof.model.layers} layers into {mp} stages")

# %% [markdown]
# ## 3. The bubble measured on a real pipeline
#
# `torch.distributed.pipelining` (PipelineStage + ScheduleGPipe / Schedule1F1B / ScheduleInterleaved1F1B)
# on identical blocks split evenly, one process per stage under torchrun (gloo on a CPU, NCCL on GPUs).
# Each rank's busy time is the time inside its stage's forward and backward; the rest of the step is
# idle. On 2 cores, 2 stages give trustworthy timings; 4 stages would be oversubscribed (two processes
# per core: they time the OS scheduler), so p=4 runs only where the machine has 4 cores or GPUs. Where
# they part from the formula: at large m the point-to-point send/recv latency between stages sets a floor
# the formula (zero-cost communication) does not have. The formulas give GPipe and 1F1B the same bubble;
# where the measured schedules differ at the same m, the difference is communication and synchronisation
# overhead, which they do not model.
# 1F1B needs m >= p: at m=1 the run falls back to GPipe (same bubble), and the table says so.
#
# **Zero bubble, measured.** `torch.distributed.pipelining` has `ScheduleInterleavedZeroBubble` and
# `ScheduleZBVZeroBubble`; both run on gloo with 2 CPU processes. With one stage per rank the first runs
# exactly ZB-H1's order (checked op by op in the tests), so the full run measures it at p=2 beside 1F1B
# (its formula: the simulated ZB-H1 with equal times). The formula assumes the split is free and the
# stages stay equal; the table's "forward ms" and "backward ms" columns (per micro-batch, B + W, mean
# over ranks) show whether that held on this machine. On our 2-core CPU it did not: the split backward of
# the rank whose input needs a gradient took longer than 1F1B's fused one, while the first stage's B is almost free (its input is
# data), so the stages were no longer equal and the slower one set the pace. ZB-V (two chunks per rank
# in a V) is not measured: the simulator does not model it.

# %%
from preflight.bench import pipeline as bench_pipeline

bub = ch.measurement(bench_pipeline.BUBBLES, lambda: bench_pipeline.measure_bubbles(quick=ch.quick))
if bub:
    br = pd.DataFrame(bub.results["rows"])
    print(bub.source)
    on_gpus = (bub.record.get("device") or {}).get("kind") == "cuda"     # the machine of the record
    if on_gpus and "ranks on" in br and (br["ranks on"] == "cpu").any():
        print("Fewer GPUs than pipeline ranks: those runs put every rank on the CPU (gloo); NCCL needs one GPU "
              "per rank. Run this measurement on a node with p GPUs for GPU numbers.")
    ch.table(br)
    for note in bub.results.get("notes", []):
        ch.note(note)
    sched = br["requested"] if "requested" in br else br["schedule"]
    fsched = (" " + sched).where(sched == "zb-h1", "")   # GPipe and 1F1B share a formula; ZB-H1 has its own
    long = pd.concat([br.assign(curve="measured " + sched + ", p=" + br["p"].astype(str))[["m", "curve"]]
                      .assign(share=br["measured_bubble"]),
                      br.assign(curve="formula" + fsched + ", p=" + br["p"].astype(str))[["m", "curve"]]
                      .assign(share=br["formula"])])
    ch.show("measured_bubble", charts.curves(long.drop_duplicates(), "m", "share", "curve", log_y=False, x_format="~g",
                                             y_format="%", title="Idle share per rank: measured vs (p-1)/(m+p-1)"))

# %% [markdown]
# Runs of your own layout (`torchrun --nproc_per_node=P -m preflight.bench.pipeline --schedule ...
# --microbatches M --out results/` on your nodes) are shown here when the audit reads `--results`.

# %%
runs = ch.measurement_set(bench_pipeline.METHOD, run=list) if ch.results_dir else None
if runs:
    print(runs.source)
    ch.table(bench_pipeline.runs_frame(runs.results["records"]))

# %% [markdown]
# ## 4. Partition by measured layer time
#
# A model whose layers cost really different times (an embedding, attention blocks, one wide FFN, a
# large output head): every layer profiled alone (forward+backward, median of repeats) gives the
# layer-time table. Split into p contiguous stages by **count** (equal numbers of layers) and by
# **time** (the exact optimal contiguous partition: minimal bottleneck, dynamic programming, not greedy).
# The pipeline runs at the pace of its slowest stage, so the predicted gain is the ratio of bottlenecks;
# both partitions then run through the real pipeline.
#
# **Your own model.** When the profile names a workload, its own blocks are timed (each on the input it
# gets inside the model) and cut into stages; the two partitions run through `torch.distributed.pipelining`
# only where its blocks run in sequence (else the chapter shows the prediction and says why).

# %%
from preflight.bench import partition as bench_partition
from preflight.bench import workload_pipeline as bench_wlpipe

wl = ch.workload        # the profile's own model, or None: the reference heterogeneous model
if wl:
    print(f"measuring {wl.label} from {wl.entry}, not the reference model")
    part = ch.workload_measurement(bench_wlpipe.METHOD, lambda: bench_wlpipe.measure_partition(wl, quick=ch.quick))
else:
    part = ch.measurement(bench_partition.METHOD, lambda: bench_partition.measure_partition(quick=ch.quick))
if part and part.results.get("by_time"):
    r = part.results
    print(part.source)
    layers = r.get("layers") or r["blocks"]
    lt = pd.DataFrame(layers)
    ch.table(lt.assign(**{"time (ms)": lt["time_s"] * 1e3}).drop(columns=["time_s"]))
    times = [x["time_s"] for x in layers]
    names = [x["name"] for x in layers]
    for label in ("count", "time"):
        print(f"by {label}:")
        pt = P.partition_table(times, r[f"by_{label}"], names)
        ch.table(pt.assign(time=pt["time"] * 1e3).rename(columns={"time": "time (ms)"}))
    if r["measured_gain"] is None:
        print(f"predicted gain {r['predicted_gain']:.2f}x; not measured: {r['in_sequence_reason']}")
    else:
        print(f"predicted gain {r['predicted_gain']:.2f}x, measured {r['measured_gain']:.2f}x "
              f"({r['throughput_count']:.1f} -> {r['throughput_time']:.1f} samples/s)")
    ch.note("The prediction assumes the stages' compute is all there is; the measurement adds send/recv "
            "and the shared CPU's noise (a few percent run to run here), so a small predicted gain can vanish "
            "in it. On GPUs with a heavy head or embedding the gain is large and survives.")

# %% [markdown]
# ## 5. Stragglers
#
# In synchronous training every step waits for the slowest rank. In a pipeline the step ends for all
# ranks together, so the imbalance shows as **idle time** on the ranks that wait: per rank, busy and
# idle time of the partition runs above. Split by count, the rank holding the heavy head is busy while
# the other idles; split by time, the idle shares come closer.

# %%
if part:
    rk = pd.DataFrame([dict(x, partition=k) for k, rows in part.results.get("ranks", {}).items() for x in rows])
    if len(rk):
        ch.table(pd.DataFrame({"partition": "by " + rk["partition"], "rank": rk["rank"],
                               "step (ms)": rk["step_s"] * 1e3, "busy (ms)": rk["busy_s"] * 1e3,
                               "idle (ms)": rk["idle_s"] * 1e3, "idle share": rk["idle_share"].map("{:.0%}".format)}))
else:
    ch.not_measured(bench_wlpipe.METHOD if wl else bench_partition.METHOD)
if wl:       # padding and the bubble are about the data and the schedule; the partition is the workload's
    from preflight.chapters import workload as W

    C.add_measured_findings(ch.findings, padm, bub, None)
    W.add_load_balance_findings(ch.findings, part)
else:
    C.add_measured_findings(ch.findings, padm, bub, part)

# %% [markdown]
# ## 6. The busiest expert and the capacity factor
#
# A mixture-of-experts layer waits for its **busiest** expert-parallel rank: the all-to-all and the expert
# GEMMs end when the rank that received the most tokens is done. A balancing loss (or DeepSeek-V3's
# loss-free bias) balances the **mean**; routing still spreads like a binomial around it. Each of `ep`
# ranks receives tokens·k copies on average and the busiest about **1 + √(2 ln ep) / √(tokens·k)** times
# that (`preflight.models.moe.busiest_rank_load`): the spread falls as 1/√tokens, so small micro-batches
# and many ranks make everyone wait. A **capacity factor** c (GShard; Megatron's
# `--moe-expert-capacity-factor`) caps each rank at c times the mean and **drops** the rest: the wait
# stops at c, the busiest rank loses 1 − c/load of its tokens (a quality cost). Dropless (Megatron's
# default, DeepSeek-V3) waits instead. The table gives the load at a few token counts and what each
# capacity factor drops; the finding `load_balance/busiest_expert` judges your plan's. A dense plan: the
# section shows DeepSeek-V3's and says so.

# %%
from preflight.chapters import moe_tables as MOE

moe_plan, moe_words = MOE.moe_profile(prof)
print(f"The busiest expert-parallel rank of {moe_words}: ep={moe_plan.training.ep}, "
      f"top-{moe_plan.model.top_k}, {MOE.tokens_per_rank(moe_plan):,.0f} tokens per rank per micro-batch.")

# %%
ask(EX["busiest"])
prediction_busiest = None       # your answer

# %%
bw = MOE.busiest_wide(moe_plan)
ch.table(bw.assign(**{c: bw[c].map(percent) for c in bw if c.startswith("dropped")}))

# %%
if interactive:
    from IPython.display import display

    from preflight.widgets import busiest_explorer
    display(busiest_explorer(MOE.tokens_per_rank(moe_plan), moe_plan.training.ep, moe_plan.model.top_k,
                             moe_plan.training.moe_capacity_factor, label=moe_plan.project))
else:
    print("Sliders: open this chapter in JupyterLab (make lab).")

# %% [markdown]
# ## Check your predictions
#
# The questions you answered before the sliders, computed with the library on your plan: how far off
# were you? The answer stays hidden until you predict (the headless audit shows it).

# %%
check(EX["bubble"], prediction_bubble, reveal=not interactive)

# %%
check(EX["bubble_m"], prediction_bubble_m, reveal=not interactive)

# %%
check(EX["busiest"], prediction_busiest, reveal=not interactive)

# %% [markdown]
# ## Stragglers: a synchronous step waits for the slowest rank
#
# Data parallelism, and every collective, is a barrier: each step lasts as long as its slowest rank.
# Give every rank the same mean step and a little independent jitter (OS noise, clocks throttled by
# heat or power, a retried network packet), standard deviation `cv` of the mean: the step then lasts
# the **maximum** of N such times, and its expectation grows with N although no rank got slower,
# `1 + cv E[max of N normals]`, where `E[max]` is 1.42 at 8 ranks, 3.25 at 1,024 and 3.97 at 16,384
# (`preflight.models.stragglers`, integrated; Blom's approximation and the large-N `sqrt(2 ln N)`
# shown beside it). So 2 % of jitter costs about 3 % on one node and 6.5 % at 1,024 GPUs. The saying "a
# few slow GPUs don't matter at scale" has it backwards. A trace audit measures both sides: the step
# spread across ranks, and who arrives last at each collective (`load_balance/trace_collective_wait`,
# section "Your job's traces"). One persistently slow rank is worse still: it sets the pace every step.

# %%
from preflight.models import stragglers as ST

cv0 = prof.training.step_jitter_cv or 0.02
print(f"{prof.gpus:,} GPUs, per-rank jitter {cv0:.1%}" + ("" if prof.training.step_jitter_cv else " (a scenario: "
      "training.step_jitter_cv is not set)") + f": expected step {ST.slowdown(prof.gpus, cv0):.3f}x the mean rank's; "
      f"Monte Carlo over 200 steps: {ST.simulate_slowdown(min(prof.gpus, 16384), cv0, steps=200):.3f}x.")
if interactive:
    from IPython.display import display

    from preflight.widgets import straggler_explorer
    display(straggler_explorer(prof.gpus, cv0))
else:
    print("Sliders: open this chapter in JupyterLab (make lab).")

# %% [markdown]
# ## What your stragglers cost
#
# The formula above says what jitter *would* cost at N ranks. What the stragglers of your own job *did*
# cost, and why, takes a per-op trace: every forward and backward compute, pipeline send/recv, gradient
# reduce-scatter, parameter all-gather and optimizer call of one rank per tensor-parallel group, timed
# with CUDA events over a few dozen steps (a Parquet file, one row per op, and a `meta*.yaml` with the
# layout). The **what-if analysis** (Lin et al., ByteDance-Seed, arXiv 2505.05713) replays the dependency
# graph of every step (stream order in a worker, send/recv between stages, collectives across replicas)
# twice: with the recorded durations, and with every op at its type's typical duration. Their ratio is
# the slowdown **S = real / ideal** (1.0: nothing straggles), `load_balance/straggler_cost` (warn above
# 1.05, fail above 1.10).
#
# Then the **attribution**: a replay that keeps only one worker, one stage or one op type as recorded says
# how much slowdown it causes alone; one that fixes only it says what share of the loss fixing it wins
# back. The cause is named with its fix: **one slow worker** (its compute slower than its stage's other
# workers in most steps: drain its node), **stage imbalance** (one pipeline stage computes more per
# micro-batch: repartition the layers), or **sequence-length imbalance** (micro-batches of unequal token
# counts: a long one is long in its forward and its backward alike; balance tokens, not sequences).
# `python -m preflight audit PROFILE --stragglers DIR` puts your job's here (also `python -m preflight
# traces DIR`). Without a folder this section shows the shared case AR in JupyterLab (64 GPUs, one slow
# worker: steps take twice as long as they would) and adds no finding; the headless audit shows nothing
# here.

# %%
from preflight.runner.evidence_section import show_stragglers

straggler_cost = show_stragglers(ch, stragglers_dir, example=interactive)

# %% [markdown]
# ## Your job's traces
#
# Across ranks, without trusting the hosts' clocks: each collective is found on every rank of its
# group (process group and sequence number, else group, type and order). Its **shortest** copy is the
# transfer itself; the rest, on each rank, is time spent **waiting for the last peer**. The rank whose
# copy is the shortest arrived last: counted over the collectives, it names the straggler. Beside it,
# the spread of step times and the compute imbalance (the busiest rank's compute per step over the
# mean). Set `traces_dir` to a folder with several ranks' traces; empty shows the embedded example
# (two ranks that talk to other ranks by send/recv only, so nothing is matched there).

# %%
from preflight.runner.trace_section import show_traces

job_traces = show_traces(ch, traces_dir, example=interactive)

# %% [markdown]
# ## Findings of this chapter

# %%
ch.table(ch.findings.frame()[["id", "value", "unit", "verdict", "threshold", "message"]])

# %% [markdown]
# ## What you learned
#
# - **Padding to the longest sample wastes most of the compute** on long-tailed lengths; length
#   bucketing recovers it.
# - **The bubble is (p−1)/(v·m + p−1)** of the step, not (p−1)/(m·p); under 10 % needs m > 9(p−1) or
#   interleaving.
# - **1F1B holds p micro-batches of activations** on the first stage instead of GPipe's m: what lets m grow.
# - **Partition by measured layer time**, not by count: the slowest stage sets the pace. And the slowest
#   rank costs every rank.

# %%
ch.next_steps()

# %% [markdown]
# Levers: bucket batches by length, raise the micro-batch count (or interleave), split the layers by
# their measured time, and find stragglers from per-rank step times before adding ranks.
#
# **Next chapter** (the playbook's order, 1 → 3 → 2 → 4 → 5): [Chapter 5: fault tolerance →](05_fault_tolerance.ipynb).
# All chapters: [README](README.md); terms: [glossary](glossary.md).
