# %% [markdown]
# # Chapter 5: Fault tolerance
#
# **Pitfall:** a long run on many nodes treated like a run on one GPU: no checkpoint, or one that
# holds only the weights, written synchronously to a slow shared file system, and no plan for the
# walltime limit. On a supercomputer failure is normal: with N nodes that each fail with probability
# p on a given day, **1−(1−p)^N** of the days see at least one failure (p = 1.0e-4, N = 1000: 9.52 % a
# day; 95 % over a 30-day run). Llama 3 405B saw 419 unexpected interruptions in 54 days on
# 16,384 GPUs (2,048 nodes): one every ~3 hours, **3.8e-3 per node-day**, 38× the 1.0e-4 the field report
# assumes. A profile without `cluster.node_failure_per_day` gets Llama 3's measured rate (the example
# uses it); every verdict below is also computed under Llama 3's rate beside the profile's own, so a site
# that enters the field report's 1.0e-4 sees how much rests on that assumption.
#
# This chapter turns that into numbers for your cluster and proves, on real machinery, that a
# checkpoint/resume design survives a SIGKILL, an elastic restart and a walltime limit:
#
# 1. **failure math** for the profile's cluster (sliders);
# 2. the **checkpoint interval**: Young's and Daly's formulas checked against a Monte Carlo simulation;
# 3. **full-state checkpoint and bitwise resume**: a real training run killed with SIGKILL, resumed,
#    and compared bit for bit with an uninterrupted run; then what breaks when a part is left out;
# 4. **two-stage durable checkpoints**: local first, shared in the background, published only when
#    durable; the training stall of synchronous vs asynchronous saves; corruption detected;
# 5. **elastic restart** under torchrun: a worker killed, the job back by itself;
# 6. the **walltime limit** on Slurm: signal, save, requeue, resume.
#
# **Time:** about 1 minute on a 2-core CPU (measured: 67 s in the audit; the runs are small on purpose:
# they test the machinery, not the hardware, and run on the CPU on a GPU node too). `plan_only = True`:
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
flight_recorder_dir = ""  # your hung job's Flight Recorder dumps (_dump_<rank>, one per rank); empty: the shared case
shared_dir = ""         # the "shared" file system for checkpoints (default: data.scratch_dir, else .cache/)

# %%
print("Loading the chapter's libraries (a few seconds) ..." if plan_only else
      "Loading the chapter's libraries, then PyTorch to probe the device (about 10 s) ...")

import os
import shutil

import pandas as pd

from preflight.chapters import fault_tolerance as C
from preflight.core.numfmt import sci
from preflight.models import checkpoint_sim as S
from preflight.models import resilience as R
from preflight.reporting import charts, failure_charts
from preflight.runner import scratch
from preflight.runner.chapter import start

ch = start("fault_tolerance", profile_path, findings_path or None, plan_only, results_dir or None,
           out_dir or None, quick=quick)
prof = ch.profile
c, t = prof.cluster, prof.training
print(f"project {prof.project}: {c.nodes} nodes x {c.gpus_per_node} GPUs, {sci(c.node_failure_per_day)} failures per "
      f"node-day, {t.run_days:g}-day run, walltime {c.walltime_h:g} h, checkpoint write {t.checkpoint_write_s:g} s, "
      f"restart {t.restart_s:g} s")
ch.announce()
work = scratch.run_folder(ch.name)   # this run's own (.cache/fault_tolerance/run-<host>-<pid>-*): two audits at
# once never share (or clear) each other's checkpoints; removed at the end of the chapter or when this process exits
shared = shared_dir or (os.path.join(prof.data.scratch_dir, "preflight-chapter5") if prof.data.scratch_dir
                        else str(work / "shared"))

# %% [markdown]
# ## 1. Failure is normal: the numbers for this cluster
#
# A node that fails with probability p on a given day survives it with probability 1−p; N independent
# nodes all survive with (1−p)^N. So the chance of **at least one failure** is 1−(1−p)^N a day and
# 1−(1−p)^(N·days) over the run. The equivalent failure rate is N·(−ln(1−p)) per day, and the
# **system MTBF** is its inverse: it shrinks in proportion to the node count. The rate is an
# assumption until your site measures it: the table shows the plan under the profile's rate and under
# Llama 3's (which counts every interruption: pre-emption, file-system hiccups and network incidents
# interrupt a job just as well). For 128 nodes: an MTBF of ~1,875 h at 1.0e-4, ~49 h at Llama 3's rate.
# The lever is not a lower rate but a **measured** one: replace `cluster.node_failure_per_day` with
# your site's interruptions per node-day, then set the interval from it.

# %%
p5 = C.add_plan_findings(ch.findings, prof, ch.gpu_key)
ch.table(C.rates_table(p5))
ch.table(C.reference_table())
ch.show("failure_probability", failure_charts.failure_prob_chart(c.node_failure_per_day, c.nodes, max(30, int(t.run_days))))

# %% [markdown]
# **Predict first.** Before the sliders: the questions below are on your own plan, each changed a little
# so that the chapter has not shown the answer. Write your prediction after `prediction_... =` and run
# the cell; the sliders then test your reasoning, and the end of the chapter computes the answer.

# %%
from preflight.chapters import exercises as X
from preflight.chapters.predict import ask, check

EX = X.fault_tolerance(prof)

# %%
ask(EX["day"])
prediction_day = None       # your answer

# %%
if interactive:
    from IPython.display import display

    from preflight.widgets import failure_explorer
    display(failure_explorer(c.node_failure_per_day, c.nodes, t.run_days))
else:
    print("Sliders: open this chapter in JupyterLab (make lab).")

# %% [markdown]
# ## 2. How often to checkpoint: formulas against a simulation
#
# Checkpointing every τ seconds costs a write of C seconds each time; a failure (one per MTBF M on
# average) costs the work since the last checkpoint, half an interval on average, plus a restart of R
# seconds. Young (1974) balanced the first-order terms, C/τ against τ/(2M), and found
# **τ = √(2·C·M)**. Daly (2006) solved the exponential model exactly enough to also count failures
# during writes and restarts: his interval is shorter when C is not small against M, and his waste
# formula is what the simulation should reproduce. Both assume **exponential (memoryless) failures**:
# independent nodes at a constant rate, no memory of the last failure. Bursts with a shared cause (a
# switch, the file system) and infant mortality after maintenance break that; check the formulas
# against your site's failure log before trusting the third digit.
#
# The **Monte Carlo simulation is the truth** here: failures drawn as a Poisson process, every
# segment of τ+C redone after a failure plus R (failures may strike during the restart too). The
# formulas are checked against it, at the profile's numbers and then on the sliders. Where C/M is not
# small (a slow write on a flaky machine) the first-order formula is visibly off; Daly's is not.

# %%
m_s = p5["mtbf_h"] * 3600
C_s, R_s = t.checkpoint_write_s, t.restart_s
if m_s == float("inf"):
    print("node_failure_per_day = 0: no failures, so no optimal interval; the checkpoint exists for the walltime.")
else:
    print(R.regime(C_s, R_s, m_s)[1])
    curve = S.waste_curve(C_s, R_s, m_s, segments=20000)
    lo, hi, best = S.optimal_range_simulated(curve)
    resolved = S.simulation_resolves_optimum(curve)
    marks = {"Young": R.young_interval(C_s, m_s), "Daly": R.daly_interval(C_s, m_s)}
    if resolved:
        marks["simulated optimum"] = best
    if t.checkpoint_interval_s:
        marks["plan"] = t.checkpoint_interval_s
    ch.show("waste_curve", failure_charts.waste_curve_chart(curve, marks, walltime_s=c.walltime_h * 3600,
                                                    title=f"Expected waste: C {C_s:g} s, R {R_s:g} s, "
                                                          f"MTBF {p5['mtbf_h']:,.0f} h"))
    rows = []
    for name, tau in marks.items():
        sim = S.simulate_waste(tau, C_s, R_s, m_s, segments=20000)
        rows.append({"interval": name, "length": C.duration(tau), "Daly's model": f"{R.daly_waste(tau, C_s, R_s, m_s):.3%}",
                     "first order": f"{R.first_order_waste(tau, C_s, R_s, m_s):.3%}",
                     "simulated (95 % CI)": f"{sim['waste']:.3%} ({sim['lo']:.3%} - {sim['hi']:.3%})"})
    ch.table(pd.DataFrame(rows))
    print(f"The simulation cannot tell intervals from {C.duration(lo)} to {C.duration(hi)} apart: the minimum is flat, "
           "so any interval in that range is as good." if resolved else
           "The simulation drew too few failures near the optimum to locate it (failures are rare at this MTBF); "
           "Daly's model is exact for this process.")

# %%
if "interval" in EX:      # not asked when the profile has no failures (no optimal interval)
    ask(EX["interval"])
prediction_interval = None       # your answer

# %%
if interactive:
    from preflight.widgets import interval_explorer
    display(interval_explorer(t.checkpoint_write_s, t.restart_s, p5["mtbf_h"] if m_s != float("inf") else 1e5,
                              t.checkpoint_interval_s, walltime_h=c.walltime_h))

# %% [markdown]
# ## 3. Full-state checkpoint, SIGKILL, bitwise resume
#
# A small real training run (`preflight.harness.trainloop`: an MLP with dropout, AdamW, warm-up + cosine
# LR schedule, shuffled batches, input noise from NumPy and feature masking from Python's `random`)
# checkpoints **everything** that decides the next step: weights, optimizer moments, scheduler
# position, the Python / NumPy / torch (CPU and CUDA) generators, the shuffle generator at the start of
# the epoch and the position in it, in samples. It is killed with **SIGKILL** by this notebook at a
# random step between two checkpoints, started again with the same command, and its losses compared
# with an uninterrupted run **bit for bit**.
#
# Then the same checkpoint is resumed four more times, each leaving one part out. The chart shows how
# far each departs from the uninterrupted run: the loss curve "jumps" after a resume that forgot
# something, which is what a practitioner sees in their logs.
#
# **Your own model.** When the profile names a workload, the same SIGKILL-and-resume runs Preflight's
# loop over *its* model, optimizer and batches (`preflight.bench.workload_resume`): the batch stream
# runs under generators of its own and is replayed to the saved position on resume. Bitwise equal, or
# the first step that differs and which state was missing (an unseeded random op in the model, say).

# %%
from preflight.bench import resume as bench_resume
from preflight.bench import workload_resume as bench_wlresume

wl = ch.workload        # the profile's own model, or None: the reference training run
if wl:
    print(f"measuring {wl.label} from {wl.entry}, not the reference training run")
    res = ch.workload_measurement(bench_wlresume.METHOD, lambda: bench_wlresume.measure_resume(
        wl, work / "workload_resume", quick=ch.quick))
else:
    res = ch.measurement(bench_resume.METHOD, lambda: bench_resume.measure_resume(work / "resume", quick=ch.quick))
if res:
    r = res.results
    print(res.source)
    print(f"killed after step {r['killed_after_step']}; resumed from the step {r['checkpoint_step']} checkpoint; "
          f"{r['steps_lost']} steps recomputed; bitwise equal: {r['resume_bitwise']}")
    ch.table(pd.DataFrame(r["rows"]))
    if r.get("missing_state"):
        print(f"first differing step {r['first_divergent_step']}; missing: {r['missing_state']}")
    cv = pd.DataFrame(r.get("curves", []))
    if len(cv):
        cv = cv[cv["abs_diff"] > 0].rename(columns={"abs_diff": "|loss - uninterrupted loss|"})
        ch.show("resume_divergence", charts.curves(cv, "step", "|loss - uninterrupted loss|", "variant", log_x=False,
                                                   log_y=True, x_format="d",
                                                   title=f"Resumed at step {r['checkpoint_step']} with one part left out: "
                                                         "distance from the uninterrupted run (log)"))
        print("The full-state resume is not drawn: its distance is exactly 0 at every step.")

# %% [markdown]
# ## 4. Two-stage, durable checkpoints
#
# **Where** a checkpoint goes decides how long training waits. Writing straight to a shared parallel
# file system stalls every rank for the whole write. The two-stage design (`preflight.toolkit.ckpt`):
#
# 1. copy the state to host memory (a snapshot: the only part training waits for),
# 2. in a background thread, write it to **fast local disk** (temporary folder, `fsync`, checksum
#    manifest, atomic `rename`),
# 3. copy it to the **shared** file system the same way, and only then **publish** it as `latest`
#    (a crash at any point leaves the previous checkpoint loadable: the tests kill it 50+ times).
#
# `torch.distributed.checkpoint` (DCP) offers the same for sharded state: `dcp.async_save`. Below, the
# stall of each, measured. Loading uses `torch.load(weights_only=True)` (or DCP): a checkpoint is
# data, and a pickle that tries to run code is refused.

# %%
from preflight.bench import ckptstall

if wl:       # its own model and optimizer: the real state size
    stall = ch.workload_measurement(bench_wlresume.STALL, lambda: bench_wlresume.measure_stall(
        wl, work / "stall", shared_dir=shared, quick=ch.quick))
else:
    stall = ch.measurement(ckptstall.METHOD, lambda: ckptstall.measure_stall(work / "stall", shared_dir=shared,
                                                                             quick=ch.quick))
if stall:
    print(stall.source)
    ch.table(C.stall_table(stall.results).round(1))
    cost = C.stall_chart_data(stall.results)
    ch.show("checkpoint_stall", charts.stacked_bars(cost, "ms", "method", "part",
                                                    title="Training time lost per checkpoint (ms)"))
    ch.note("The **stall** is what the training loop waits for; the **hidden cost** is how much slower the steps "
            "run while the background write competes for the same CPU cores. On this CPU the training itself "
            "uses the cores the writer needs; on a GPU node the step runs on the GPU and the cores are free, so "
            "the hidden cost mostly disappears. \"durable after\": until the checkpoint is safe on the shared "
            "file system (a failure before then falls back to the previous one).")

# %% [markdown]
# Corruption, live: two checkpoints, then the newest damaged (a flipped byte, as a bad disk or an
# interrupted copy leaves it). The manifest's sha256 catches it, the loader says why, and falls back to
# the previous one. A checkpoint whose pickle would run code is refused by `weights_only=True`.

# %%
from preflight.bench import corruption

if ch.measure:
    demo = corruption.demo(work / "corruption")
    print(f"loaded step {demo['loaded_step']} from {demo['loaded_from']}; the loader warned:")
    for message in demo["warnings"]:
        print("  " + message)
    print("refused:", demo["refused"] or "NOT refused: the hostile checkpoint loaded")
    print("its payload ran:", "YES" if demo["ran_code"] else "no")
else:
    print("plan-only: this live demonstration runs when the chapter measures")

# %% [markdown]
# ## 5. Elastic restart: torchrun brings the job back
#
# `torchrun --max-restarts=2 --rdzv-backend=c10d` (torch.distributed.elastic) on two processes with
# DDP. Rank 1 kills itself with SIGKILL mid-run, as a crashed GPU or the OOM killer would; the agent
# tears down the survivor, runs a new rendezvous and starts both again, and the script resumes from its
# latest checkpoint. Measured: the **recovery time** (kill → first step trained again) and the
# **steps lost** (since the last checkpoint). The field case: a node failed, world size 128 → 120,
# recovery in minutes, the last tens of seconds of data lost. On a cluster, also pass
# `--nnodes=MIN:MAX` so the job continues on fewer nodes: the case measured next.

# %%
from preflight.bench import elastic as bench_elastic

ela = ch.measurement(bench_elastic.METHOD, lambda: bench_elastic.measure_elastic(work / "elastic", quick=ch.quick))
if ela:
    e = ela.results
    print(ela.source)
    ch.table(pd.DataFrame([{k: e[k] for k in ("restarts", "killed_after_step", "resumed_from", "steps_lost",
                                              "recovery_s", "time_to_regain_s", "final_loss_equal", "wall_s")}]))
if wl:       # the elastic restart is the reference training run's; resume and stall are the workload's
    from preflight.chapters import workload as W

    C.add_measured_findings(ch.findings, None, None, ela)
    W.add_fault_tolerance_findings(ch.findings, res, stall)
else:
    C.add_measured_findings(ch.findings, res, stall, ela)

# %% [markdown]
# ### A node lost: the world size shrinks, training goes on
#
# The field case itself: a node fails, the job continues on the ones left. Two torchrun agents, one per
# node, `--nnodes=1:2` (c10d rendezvous on node 0), one worker each; after a step, node 1's worker
# SIGKILLs its agent and itself. No agent is left there to restart anything: the survivor's collective
# fails, its agent runs a new rendezvous, which closes with the one node left, and training resumes at
# world size 1 from the newest checkpoint. The checkpoint keeps the data position in **samples**, so
# the smaller world goes on with the very next sample of the epoch's permutation. Bitwise: the steps
# before the change equal the uninterrupted 2-rank run; the steps after it equal a 1-rank run from the
# same checkpoint, and not the uninterrupted run (the global batch halves: another trajectory, by
# design). Measured in a two-node Slurm allocation, where srun places the agents
# (`sbatch --nodes=2 --wrap "python -m preflight.bench.elastic --shrink --out results/"`; anywhere else
# `python -m preflight.bench.elastic --shrink` runs both agents on one machine); the audit reads it with
# `--results`, and the test suite runs it on two Slurm nodes of one host.

# %%
shrink = ch.recorded(bench_elastic.SHRINK)          # a record only: the audit does not kill nodes itself
if shrink:
    sr = shrink.results
    print(shrink.source)
    ch.table(pd.DataFrame([{k: sr[k] for k in ("launcher", "world_before", "world_after", "killed_after_step",
                                              "resumed_from", "steps_lost", "recovery_s", "samples_lost",
                                              "samples_repeated", "before_change_equal", "after_change_equal")}]))
else:
    ch.not_measured(bench_elastic.SHRINK, "the audit never kills a node itself; it reads this measurement from "
                    "a record: run `python -m preflight.bench.elastic --shrink --out results/` (on two Slurm "
                    "nodes: the `sbatch` line above) and pass `--results results/`.")
C.add_shrink_finding(ch.findings, shrink)

# %% [markdown]
# ## 6. The walltime limit on Slurm: signal, save, requeue
#
# A 30-day run does not fit a 48-hour allocation. The scheduler can warn before the limit
# (`#SBATCH --signal=B:USR1@<seconds>`: to the batch shell); the job script traps it, asks the training
# to checkpoint and exit cleanly, and requeues itself (`scontrol requeue`); the next allocation resumes
# from the checkpoint. The trap: **torchrun does not forward SIGUSR1 to its workers**, so the template's
# trap creates a stop file (it works through srun, torchrun and across nodes). Only rank 0 looks for
# it, every k steps, and broadcasts the decision on the training device, so that every rank stops after
# the same step: at 1024 ranks, a `stat` per rank per step would be 1024 metadata requests per step on
# the shared file system. k = ceil(check time / (0.1 % of a step)), at most 5 s of training apart
# (`preflight.toolkit.stoppoll`). Slurm may signal up to a minute earlier than asked: leave that margin.
#
# The template ships with the library (`preflight/slurm/walltime_requeue.sbatch`). The test suite runs
# it on a real Slurm (slurmctld + slurmd + munge, brought up by the test), on one node and on two
# (nodes n1 and n2 on one host): the training spans two allocations, both nodes' workers stop at the
# same step, and it ends with the same losses, bit for bit, as an uninterrupted run.

# %%
from importlib.resources import files

template = files("preflight") / "slurm" / "walltime_requeue.sbatch"
text = template.read_text()
print(f"lib/preflight/slurm/{template.name}  ({len(text.splitlines())} lines); its header:\n")
print("\n".join(line for line in text.splitlines()[:40]))

# %% [markdown]
# ## Check your predictions
#
# The questions you answered before the sliders, computed with the library on your plan: how far off
# were you? The answer stays hidden until you predict (the headless audit shows it).

# %%
check(EX["day"], prediction_day, reveal=not interactive)

# %%
if "interval" in EX:
    check(EX["interval"], prediction_interval, reveal=not interactive)

# %% [markdown]
# ## When the job hangs: which rank, and at which collective
#
# A failure that kills a process is seen at once; a **hang** is not. One rank stops launching collectives
# (a GPU error, a Python thread holding the GIL, a dead process, a code path the others did not take), and
# its peers launch the next collective and wait in it, and everything behind them waits too, until the
# NCCL watchdog's timeout ends the job, often with little more said than "Watchdog caught collective
# operation timeout". At 1,000 ranks the rank that stopped is one line in a thousand logs.
#
# PyTorch's **Flight Recorder** keeps each rank's last collectives in a ring buffer (process group,
# sequence id, op, shapes, dtypes, and per group the last collective the rank launched and the last it
# saw complete) and writes it at that timeout, one `_dump_<rank>` file per rank. Lined up across ranks,
# the dumps say where progress stopped: a collective its group's other members launched and wait in, and
# the members that **never launched it**. A rank behind its peers in every group it is in, and ahead of
# nobody, is where the waiting starts (`python -m preflight hang DIR`, the method and its comparison with
# NVIDIA's analyser: docs/flight-recorder.md). The dumps are pickles: they are read by an unpickler that
# admits builtin values only, never by `pickle.load`.
#
# **The picture**: ranks (rows) x kinds of process group (columns); each cell how many collectives that
# rank launched behind its group's leader, red where it never launched the collective the group waits in.
# In a real hang one or two rows are red across their groups, and the rest of their groups wait (orange).
#
# **Turn it on before the job hangs.** In every rank's environment (the job script, before `torchrun` or
# `srun`):
#
# - `TORCH_NCCL_TRACE_BUFFER_SIZE=2000` (`TORCH_FR_BUFFER_SIZE` in recent PyTorch): keep each rank's last
#   2,000 collectives (0, the default, records nothing; the cost is a few hundred bytes per collective);
# - `TORCH_NCCL_DUMP_ON_TIMEOUT=1`: write them when a collective passes its timeout (the `timeout=` of
#   `init_process_group`); the rank that times out tells the others through the rendezvous store, so every
#   live rank writes its file;
# - `TORCH_FR_DUMP_TEMP_FILE=/shared/fs/fr/$SLURM_JOB_ID/_dump_` (older name, still read:
#   `TORCH_NCCL_DEBUG_INFO_TEMP_FILE`; the default `/tmp/nccl_trace_rank_` is each node's local disk): each
#   rank writes `<prefix><rank>`; a folder that exists, on a file system every node sees.
#
# **The trigger** is the collective timeout: keep it shorter than the walltime left, or the scheduler
# kills the job before anything is dumped. To dump a running job on demand, call
# `torch._C._distributed_c10d._dump_fr_trace()` (`_dump_nccl_trace()` in older builds) in each rank and
# write the bytes it returns to `<prefix><rank>`; a job that is not hung shows ranks a few collectives
# apart by design, so judge dumps taken at the hang. Then `python -m preflight audit PROFILE
# --flight-recorder DIR` puts the answer here, as `fault_tolerance/hang_attribution` (its value: how many
# ranks are named; each one's confidence in `per_rank`). Without a folder this section shows a shared
# public case in JupyterLab (a GPU error injected into ranks 9 and 14 of a 16-rank MoE job) and adds no
# finding; the headless audit shows nothing here.

# %%
from preflight.runner.evidence_section import show_hang

hang = show_hang(ch, flight_recorder_dir, example=interactive)

# %% [markdown]
# ## Your job's traces
#
# A trace of a few steps cannot show checkpointing, resume or what a failure costs: this chapter's
# verdicts come from the profile and its measurements above, and the trace section says so rather than
# guess. Set `traces_dir` to see the job's traces named here too.

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
# - **Failure is normal at scale**: 1 − (1 − p)^(N·days), and the system MTBF shrinks with the node count.
# - **The checkpoint interval** comes from Young's √(2 C M) and Daly's refinement, checked against a
#   simulation; the waste curve is flat near its minimum.
# - **A checkpoint must hold the full state** (model, optimizer, scheduler, RNG, data position) to resume
#   bit for bit; leave one part out and the run diverges.
# - **Write durably without stalling**: local first, shared in the background, `latest` published last;
#   an elastic restart and the walltime requeue bring the job back by themselves.

# %%
shutil.rmtree(work, ignore_errors=True)      # this run's scratch folder (§0): its measurements are done

# %%
ch.next_steps()

# %% [markdown]
# Levers: measure your site's interruptions per node-day and set the interval from them, save the full
# state asynchronously in two stages, and submit with the walltime template (signal, save, requeue).
#
# **Next →** your own plan: `python -m preflight audit your.yaml` runs all five chapters on it and writes
# a report with the fixes that buy the most first. Back to [all chapters](README.md); terms:
# [glossary](glossary.md).
