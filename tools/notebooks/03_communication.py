# %% [markdown]
# # Chapter 3: Communication vs computation
#
# **Pitfall:** gradient communication that is not overlapped with compute. Data parallelism
# all-reduces every gradient every step; when that takes longer than the backward pass can hide, each
# added GPU adds waiting. The field case: a 7B model in FP32 on 200 Gb/s links moves about 56 GB per
# rank per step, over 2 s against 0.8 s of compute.
#
# What this chapter does:
#
# 1. **computes** what your gradients cost to move (calculator with sliders, flat ring vs hierarchical);
# 2. **measures** what the interconnect delivers: an all-reduce sweep from KB to hundreds of MB under
#    torchrun (gloo between processes on a CPU, NCCL on GPUs), algbw and busbw, an alpha-beta fit;
# 3. **proves** overlap on a real DistributedDataParallel loop: bucket sizes, a manual all-reduce as the
#    no-overlap reference, bf16/fp16 compression hooks, PowerSGD, gradient accumulation with `no_sync()`;
# 4. checks the **topology** of your layout (tensor parallelism inside a node, data parallelism across).
#
# **Time:** under a minute on a 2-core CPU (measured: 39 s in the audit). On a GPU node: not timed yet.
# `plan_only = True`: the formulas only (seconds).

# %%
# parameters: the audit (papermill) overrides these; in JupyterLab edit them here.
profile_path = "../data/profiles/example.yaml"
findings_path = ""      # where the audit collects findings; empty: keep them in memory
plan_only = False       # True: formulas on the profile only, no live measurement
results_dir = ""        # folder of recorded measurements (e.g. from your cluster) to use instead
out_dir = ""            # the audit's output folder (records, charts)
quick = False           # smallest sizes (smoke test)
interactive = True      # show the sliders (the headless audit turns them off)

# %%
import pandas as pd

from preflight import charts
from preflight.chapter import start
from preflight.chapters import communication as C

ch = start("communication", profile_path, findings_path or None, plan_only, results_dir or None,
           out_dir or None, quick=quick)
prof = ch.profile
print(f"project {prof.project}: {prof.model.params / 1e9:g}B params, {prof.training.grad_dtype} gradients, "
      f"{prof.gpus} GPUs (tp={prof.training.tp}, pp={prof.training.pp}, dp={prof.dp})")
ch.announce()

# %% [markdown]
# ## 1. What your gradients cost to move
#
# Ring all-reduce over D data-parallel ranks (reduce-scatter, then all-gather): every rank sends and
# receives **2·M/(tp·pp)·(D−1)/D·b** bytes per step (b bytes per gradient element), in 2(D−1) steps of
# latency α:
#
# **t = 2(D−1)/D · S/B + 2(D−1)·α**, with S = M/(tp·pp)·b the gradient buffer.
#
# A flat ring runs at its slowest link: the inter-node bandwidth as soon as it spans nodes. A
# **hierarchical** all-reduce (what NCCL does inside a node first) reduce-scatters over NVLink, all-reduces
# one 1/g shard per GPU across nodes (every GPU on its own NIC), then all-gathers over NVLink: the
# inter-node bytes drop by g. Against compute: backward (about 2/3 of it) is what can hide communication;
# more than that is exposed.

# %%
p = C.add_plan_findings(ch.findings, prof)
C.add_topology_finding(ch.findings, prof)
ch.table(pd.DataFrame([
    {"quantity": "data-parallel ranks D", "value": f"{p['dp']}"},
    {"quantity": "gradient buffer per rank S", "value": f"{p['buffer_bytes'] / 1e9:.3g} GB"},
    {"quantity": "bytes sent per rank per step", "value": f"{p['bytes_per_rank'] / 1e9:.3g} GB"},
    {"quantity": f"flat ring ({p['link']})", "value": f"{p['flat_s']:.3g} s"},
    {"quantity": "hierarchical (NVLink, then across nodes)", "value": f"{p['hierarchical_s']:.3g} s"},
    {"quantity": "compute per step", "value": f"{p['compute_s']:.3g} s"},
    {"quantity": "communication / compute", "value": f"{p['ratio']:.2f}x"},
    {"quantity": "efficiency: no overlap / full overlap",
     "value": f"{p['efficiency_no_overlap']:.0%} / {p['efficiency_full_overlap']:.0%}"},
]))

# %%
if interactive:
    from IPython.display import display

    from preflight.widgets import allreduce_explorer
    tier = "InfiniBand HDR 200 Gb/s per GPU"
    display(allreduce_explorer(prof.model.params, p["dp"], prof.training.grad_dtype, tier,
                               prof.training.step_compute_s, prof.training.step_serial_s, prof.cluster.gpus_per_node,
                               prof.cluster.intra_node_GBps, tp=prof.training.tp, pp=prof.training.pp))
else:
    print("Sliders: open this chapter in JupyterLab (make lab).")

# %% [markdown]
# ## 2. What the interconnect delivers: an all-reduce sweep
#
# `torch.distributed.all_reduce` on message sizes from 4 KB up, each timed with a barrier before it, the
# slowest rank's time per iteration, the median over iterations (the mean carries the scheduler's tail).
# Reported the nccl-tests way: **algbw = S/t** and **busbw = algbw · 2(n−1)/n**, the bandwidth each link
# really carried, comparable across rank counts. The alpha-beta line is the ring model fitted to the
# points (relative least squares); its error per size says where to trust it.
#
# The same measurement on your cluster, then audited with its numbers:
# `torchrun --nproc_per_node=8 -m preflight.bench.allreduce --out results/` (or under `srun`), then
# `python -m preflight audit my.yaml --results results/`.
#
# On this machine's CPU the "devices" are 2 processes over gloo (3-4 processes on 2 cores measure the
# scheduler, not the network).

# %%
from preflight.bench import allreduce as bench_allreduce
from preflight.bench.launch import max_processes

nproc = min(max_processes()[0], 8) if ch.device.is_gpu else 2
sweep = (ch.measurement(bench_allreduce.METHOD, lambda: bench_allreduce.measure(nproc, quick=ch.quick), name=f"n{nproc}")
         if nproc >= 2 else None)
nccl_log = sweep.results.get("nccl_log", "") if sweep else ""      # NCCL_DEBUG=INFO lines, on GPUs
if sweep:
    sw = bench_allreduce.sweep_frame({"results": sweep.results})
    print(f"{sweep.source}: {sweep.results['world_size']} ranks, {sweep.results.get('backend')}")
    ch.table(pd.DataFrame({"size (MB)": sw["bytes"] / 1e6, "median (ms)": sw["time_s"] * 1e3,
                           "algbw (GB/s)": sw["algbw_GBps"], "busbw (GB/s)": sw["busbw_GBps"],
                           "fit (ms)": sw["fit_time_s"] * 1e3, "fit error": sw["fit_rel_error"].map("{:+.0%}".format)}))
    long = pd.concat([pd.DataFrame({"bytes": sw["bytes"], "seconds": sw["time_s"], "curve": "measured (median)"}),
                      pd.DataFrame({"bytes": sw["bytes"], "seconds": sw["fit_time_s"], "curve": "alpha-beta fit"})])
    ch.show("allreduce_sweep", charts.curves(long, "bytes", "seconds", "curve",
                                             title="All-reduce time per message size"))
elif ch.measure:
    print("one device only: no all-reduce to measure here")
C.add_sweep_findings(ch.findings, prof, sweep,
                     "plan-only mode" if not ch.measure else "one device only (needs 2 ranks)")

# %% [markdown]
# ## 3. Overlap, compression and accumulation on a real DDP loop
#
# The same training loop, two ranks, in several configurations: compute alone (no communication); a
# manual all-reduce of every gradient **after** backward (the no-overlap reference); DDP with small,
# default (25 MB) and one huge bucket (a single bucket only starts when backward ends: no overlap);
# fp16 and bf16 compression hooks (half the bytes; torch's `bf16_compress_hook` is refused by a torch
# built without NCCL, so the library has an equivalent that runs everywhere:
# `preflight.hooks.bf16_compress_hook`); PowerSGD (low-rank,
# far fewer bytes, changes numerics); accumulation over 4 micro-batches with `no_sync()`
# (communication once every 4).
#
# **Be honest about the CPU.** On 2 cores, compute and gloo's communication thread fight for the same
# cores: bucketing shows no overlap gain there (field notes). So the chapter runs an **emulated-device**
# mode: each layer's forward and backward is a timed wait that frees the CPU, as a GPU kernel does,
# while the gradients are real tensors that DDP really all-reduces. Overlap shows there. The real mode
# runs the same loop with real compute, and its losses after N steps show which technique changes the
# numerics. On GPUs with NCCL the real mode measures the real thing.

# %%
from preflight.bench import overlap as bench_overlap


def _overlap(mode):
    return ch.measurement(bench_overlap.METHOD, lambda: bench_overlap.measure(mode, quick=ch.quick), name=mode,
                          match=lambda r: r["results"].get("mode") == mode)

# 2 ranks always: on GPUs when there are 2, else on the CPU (gloo), where the emulated mode shows overlap
emulated = _overlap("emulated") if nproc < 2 or not ch.device.is_gpu else None
real = _overlap("real")
for run in (emulated, real):
    if run:
        label = "EMULATED device (timed waits free the CPU)" if run.results["mode"] == "emulated" else "real compute"
        print(f"{label} - {run.source}")
        t = C.overlap_table(run.results["rows"])
        ch.table(t)
        ch.show(f"overlap_{run.results['mode']}", charts.bars(t, "step (ms)", "configuration",
                                                               title=f"Step time per configuration ({label})"))
if emulated or real:
    ch.note("Reading the tables: `compute_only` trains each rank alone (no gradient averaging), so its loss "
            "differs from the data-parallel ones; `ddp_no_sync_k4` updates once per 4 micro-batches, a "
            "different schedule, so its loss differs by design. Only bf16/fp16/PowerSGD change the numerics of "
            "the same schedule. PowerSGD sends ~100x fewer bytes but costs compute (low-rank products) and three "
            "all-reduces per bucket: on a CPU over loopback that is slower; it pays on slow inter-node links. "
            "Differences under ~10 % between runs are noise on a shared 2-core CPU.")
C.add_overlap_findings(ch.findings, emulated, real,
                       "plan-only mode" if not ch.measure else "one device only (needs 2 ranks)")

# %% [markdown]
# ## 4. Topology
#
# Tensor parallelism all-reduces activations in every layer: its groups must stay inside a node, on
# NVLink. Data parallelism all-reduces once per step and can span nodes; pipeline stages exchange small
# activations point to point. The rules applied to your layout (Megatron-LM's rank order: tensor
# parallel fastest, then data parallel, then pipeline):

# %%
from preflight import topology

ch.table(pd.DataFrame(topology.check_layout(prof.cluster.gpus_per_node, prof.cluster.nodes,
                                            prof.training.tp, prof.training.pp)))
topo = topology.nvidia_smi_topo() if ch.measure and ch.device.is_gpu else None
if topo is not None:
    print("nvidia-smi topo -m on this machine:")
    ch.table(topo.reset_index())
else:
    print("nvidia-smi topo -m: not available here (no NVIDIA GPU). On a GPU node it shows the links "
          "(NV# = NVLink, PIX/PXB = PCIe switch, SYS = across CPU sockets).")
if "NCCL INFO" in nccl_log:
    from preflight import nccl_log as nccl
    parsed = nccl.parse_nccl_log(nccl_log)
    print("What NCCL chose for the sweep above (NCCL_DEBUG=INFO):", nccl.nccl_findings_text(parsed))
    ch.table(nccl.nccl_summary(parsed))
ch.note("To see what NCCL really chose, run with `NCCL_DEBUG=INFO` and parse the log: "
        "`preflight.nccl_log.parse_nccl_log(text)` gives the transports (P2P/NVLink, SHM, NET/IB with "
        "GPUDirect RDMA, or a fallback to NET/Socket), rings, trees, channels and the path of every peer.")

# %% [markdown]
# ## Predict, then measure
#
# Questions on your own plan. Write your prediction after `prediction =` and run the cell; the next
# cell computes the answer with the library (on this profile, or measured on this machine) and says how
# far off you were. The answer stays hidden until you predict (the headless audit shows it).

# %%
from preflight.chapters import exercises as X
from preflight.exercises import ask, check

EX = X.communication(prof)

# %%
ask(EX["volume"])
prediction = None       # your answer

# %%
check(EX["volume"], prediction, reveal=not interactive)

# %%
ask(EX["time"])
prediction = None       # your answer

# %%
check(EX["time"], prediction, reveal=not interactive)

# %% [markdown]
# ## Findings of this chapter

# %%
ch.table(ch.findings.frame()[["id", "value", "unit", "verdict", "threshold", "message"]])
