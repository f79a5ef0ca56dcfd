# %% [markdown]
# # Chapter 3: Communication vs computation
#
# **Pitfall:** gradient communication that is not overlapped with compute. Data parallelism
# all-reduces every gradient every step; when that takes longer than the backward pass can hide, each
# added GPU adds waiting. The field case: a 7B model in FP32 moves about 56 GB per rank per step; the
# field report divides that by one 200 Gb/s link and gets over 2 s against 0.8 s of compute. On nodes
# with one NIC per GPU NCCL spreads it over all eight NICs: about 0.3 s. Both are computed below, and
# when each holds.
#
# What this chapter does:
#
# 1. **computes** what your gradients cost to move (calculator with sliders: NCCL's rings on the rails
#    beside the field report's flat arithmetic);
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
traces_dir = ""         # your job's torch.profiler traces (a folder, one file or more per rank); empty: the example

# %%
print("Loading the chapter's libraries (a few seconds) ..." if plan_only else
      "Loading the chapter's libraries, then PyTorch to probe the device (about 10 s) ...")

import pandas as pd

from preflight.chapters import communication as C
from preflight.core.numfmt import gb, gib, num, percent, plural, seconds
from preflight.models import comm
from preflight.reporting import charts
from preflight.runner.chapter import start

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
# The time is **V / busbw** (V = 2(D−1)/D·S), and busbw, nccl-tests' *bus bandwidth*, depends on where
# the group's ranks sit (Megatron order: tp fastest, then dp, then pp):
#
# - inside one node every hop is NVLink: busbw = the NVLink bandwidth;
# - across nodes NCCL runs several rings (channels); each ring enters and leaves a node once, and the
#   rings of a node with k ranks of the group leave through k different NICs (rail-optimised nodes have
#   one NIC per GPU): **busbw = k × B_NIC**, bounded by NVLink. nccl-tests on 8 × 400 Gb/s nodes report
#   ~360–430 GB/s, i.e. 8 × 50 GB/s. With tp = 8 on 8-GPU nodes each dp group has one rank per node:
#   busbw = one NIC. With fewer NICs than GPUs the groups of a node share them.
#
# **The saying:** "56 GB at 200 Gb/s takes over 2 s" is V / B_NIC: true when the node has **one**
# 200 Gb/s NIC (or a ring crosses the network at every hop), not with one NIC per GPU. The table shows
# both. NCCL picks a tree instead of the ring for small messages at many ranks (latency 2·log2(D)·α
# instead of 2(D−1)·α); for a whole step's gradients the bandwidth term decides.
#
# Against compute: backward (about 2/3 of it) is what can hide communication, and with gradient
# accumulation (`no_sync` on all but the last micro-batch) only the **last micro-batch's** backward can:
# the one all-reduce per step starts there.

# %%
p = C.add_plan_findings(ch.findings, prof, ch.gpu_key)
C.add_topology_finding(ch.findings, prof)
ch.table(pd.DataFrame([
    {"quantity": "data-parallel ranks D", "value": f"{p['dp']}"},
    {"quantity": "gradient buffer per rank S (memory)", "value": gib(p["buffer_bytes"])},
    {"quantity": "bytes sent per rank per step (on the wire)", "value": gb(p["bytes_per_rank"])},
    {"quantity": "placement", "value": f"{plural(p['ranks_per_node'], 'rank')} per node, {plural(p['nodes'], 'node')}, "
                                       f"{plural(p['nics_per_node'], 'NIC')} per node"},
    {"quantity": "predicted bus bandwidth", "value": f"{num(p['busbw_GBps'])} GB/s"},
    {"quantity": "all-reduce per step (NCCL rings on the rails)", "value": seconds(p["time_s"])},
    {"quantity": "the field report's flat arithmetic (one NIC carries it all)", "value": seconds(p["flat_s"])},
    {"quantity": "latency: ring 2(D-1)α / tree 2·log2(D)·α",
     "value": f"{num(p['ring_latency_s'] * 1e3)} ms / {num(p['tree_latency_s'] * 1e3)} ms"},
    {"quantity": "compute per step", "value": seconds(p["compute_s"])},
    {"quantity": "communication / compute", "value": f"{num(p['ratio'])}x"},
    {"quantity": "efficiency: no overlap / full overlap",
     "value": f"{percent(p['efficiency_no_overlap'])} / {percent(p['efficiency_full_overlap'])}"},
]))
# The verdicts read the one step model (preflight.chapters.step): the same traffic as the framework runs it
# (ZeRO stage, experts over their expert-data-parallel group, bucket latency), and what compute leaves exposed.
if p["step"] is not None:
    ch.table(pd.DataFrame([{"term of the step": w, "seconds": seconds(v)} for _, w, v in p["step"].term_list()]
                          + [{"term of the step": "the step", "seconds": seconds(p["step"].step_s)},
                             {"term of the step": "data-parallel bytes per rank, as the framework runs it",
                              "seconds": gb(p["dp_bytes"])},
                             {"term of the step": "data-parallel traffic, all of it", "seconds": seconds(p["dp_comm_s"])}]))

# %% [markdown]
# **Predict first.** Before the sliders: the questions below are on your own plan, each changed a little
# so that the chapter has not shown the answer. Write your prediction after `prediction_... =` and run
# the cell; the sliders then test your reasoning, and the end of the chapter computes the answer.

# %%
from preflight.chapters import exercises as X
from preflight.chapters.predict import ask, check

EX = X.communication(prof)

# %%
ask(EX["volume"])
prediction_volume = None       # your answer

# %%
ask(EX["time"])
prediction_time = None       # your answer

# %%
if interactive:
    from IPython.display import display

    from preflight.widgets import allreduce_explorer
    tier = C.closest_tier(prof)
    display(allreduce_explorer(prof.model.params, p["dp"], prof.training.grad_dtype, tier,
                               p["compute_s"], p["work_s"] - p["compute_s"], prof.cluster.gpus_per_node,
                               prof.cluster.intra_node_GBps, tp=prof.training.tp, pp=prof.training.pp,
                               nics_per_node=prof.nics_per_node, microbatches=prof.training.microbatches))
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
#
# **Across nodes.** One node's sweep measures NVLink or PCIe; the network between nodes is what data
# parallelism crosses from the second node on. In a Slurm allocation of two nodes,
# `sbatch --nodes=2 slurm/torchrun_nodes.sbatch preflight.bench.allreduce --out results/` runs the same
# sweep with one torchrun per node; `--results results/` shows it below, next to the single-node one.
# The record keeps every rank's host, so a run whose "nodes" share one host (loopback, not a network:
# Preflight's own two-node Slurm test is one) is named as such in the finding.

# %%
from preflight.bench import allreduce as bench_allreduce
from preflight.harness.launch import max_processes

gpus_here = ch.measure and ch.device.is_gpu      # live runs on GPUs (plan-only: nothing runs here)
nproc = min(max_processes()[0], 8) if gpus_here else 2
one_node = lambda rec: int(rec["results"].get("nodes", 1) or 1) == 1      # noqa: E731
sweep = (ch.measurement(bench_allreduce.METHOD, lambda: bench_allreduce.measure(nproc, quick=ch.quick), name=f"n{nproc}",
                        match=one_node) if nproc >= 2 else None)
nccl_log = sweep.results.get("nccl_log", "") if sweep else ""      # NCCL_DEBUG=INFO lines, on GPUs
if sweep:
    sw = bench_allreduce.sweep_frame({"results": sweep.results})
    print(f"{sweep.source}: {sweep.results['world_size']} ranks, {sweep.results.get('backend')}")
    ch.table(pd.DataFrame({"size (MB)": sw["bytes"] / 1e6, "median (ms)": sw["time_s"] * 1e3,
                           "algbw (GB/s)": sw["algbw_GBps"], "busbw (GB/s)": sw["busbw_GBps"],
                           "fit (ms)": sw["fit_time_s"] * 1e3, "fit error": sw["fit_rel_error"].map("{:+.0%}".format)}))
    long = pd.concat([pd.DataFrame({"bytes": sw["bytes"], "ms": sw["time_s"] * 1e3, "curve": "measured (median)"}),
                      pd.DataFrame({"bytes": sw["bytes"], "ms": sw["fit_time_s"] * 1e3, "curve": "alpha-beta fit"})])
    ch.show("allreduce_sweep", charts.curves(long, "bytes", "ms", "curve", x_title="message size (bytes)",
                                             y_format=",~g", title="All-reduce time per message size (ms)"))
elif ch.measure:
    print("one device only: no all-reduce to measure here")
C.add_sweep_findings(ch.findings, prof, sweep,
                     "plan-only mode" if not ch.measure else "one device only (needs 2 ranks)")

# %%
across = ch.recorded(bench_allreduce.METHOD, match=lambda rec: not one_node(rec))     # never measured live
if across:
    sa = bench_allreduce.sweep_frame({"results": across.results})
    print(f"{across.source}: {across.results['world_size']} ranks on {across.results.get('nodes')} nodes "
          f"({', '.join(across.results.get('slurm_nodes') or [])}), hosts {across.results.get('hosts')}")
    both = pd.concat([pd.DataFrame({"bytes": f["bytes"], "busbw_GBps": f["busbw_GBps"], "sweep": name})
                      for f, name in ((sa, f"{across.results.get('nodes')} nodes"), (sw if sweep else None, "one node"))
                      if f is not None])
    print("busbw (GB/s) per message size:")
    ch.table(both.pivot(index="bytes", columns="sweep", values="busbw_GBps").reset_index())
    ch.show("allreduce_nodes", charts.curves(both, "bytes", "busbw_GBps", "sweep",
                                             title="Bus bandwidth (GB/s): one node and across nodes"))
C.add_nodes_sweep_finding(ch.findings, across, sweep)

# %% [markdown]
# ## 3. Overlap, compression and accumulation on a real DDP loop
#
# The same training loop, two ranks, in several configurations: compute alone (no communication); a
# manual all-reduce of every gradient **after** backward (the no-overlap reference); DDP with small,
# default (25 MB) and one huge bucket (a single bucket only starts when backward ends: no overlap);
# fp16 and bf16 compression hooks (half the bytes; torch's `bf16_compress_hook` is refused by a torch
# built without NCCL, so the library has an equivalent that runs everywhere:
# `preflight.toolkit.hooks.bf16_compress_hook`); PowerSGD (low-rank,
# far fewer bytes, changes numerics); accumulation over 4 micro-batches with `no_sync()`
# (communication once every 4).
#
# **Be honest about the CPU.** On 2 cores, compute and gloo's communication thread fight for the same
# cores: bucketing shows no overlap gain there (field notes). So the chapter runs an **emulated-device**
# mode: each layer's forward and backward is a timed wait that frees the CPU, as a GPU kernel does,
# while the gradients are real tensors that DDP really all-reduces. Overlap shows there. The real mode
# runs the same loop with real compute, and its losses after N steps show which technique changes the
# numerics. On GPUs with NCCL the real mode measures the real thing.
#
# **Your own model.** When the profile names a workload, DDP runs on *it* instead (two ranks,
# `preflight.bench.workload_overlap`): its real gradient bytes and DDP's buckets, the bucket sizes, the
# fp16 / bf16 hooks and `no_sync()`, with the drift of its own loss. On a CPU it also runs in the
# emulated-device mode: each of its blocks becomes a timed wait as long as that block's measured
# forward and backward, holding the block's real parameter shapes, so DDP builds *its* buckets and the
# overlap shows as it would on an accelerator that computes at this CPU's pace.

# %%
from preflight.bench import overlap as bench_overlap


def _overlap(mode):
    return ch.measurement(bench_overlap.METHOD, lambda: bench_overlap.measure(mode, quick=ch.quick), name=mode,
                          match=lambda r: r["results"].get("mode") == mode)

from preflight.bench import workload_overlap as bench_wloverlap

wl = ch.workload        # the profile's own model, or None: the reference layer stack
if wl:
    print(f"measuring {wl.label} from {wl.entry}, not the reference layer stack")
    def _wl_overlap(mode):
        return ch.workload_measurement(bench_wloverlap.METHOD, lambda: bench_wloverlap.measure(wl, quick=ch.quick,
                                                                                                mode=mode),
                                       name=mode, match=lambda r: (r.get("results") or {}).get("mode") == mode)

    wov = _wl_overlap("real")
    gpus = wov is not None and wov.results.get("backend") == "nccl"       # a GPU record: overlap is real there
    wem = _wl_overlap("emulated") if (nproc < 2 or not gpus_here) and not gpus else None
    emulated = real = None
    for run, chart in ((wem, "overlap_workload_emulated"), (wov, "overlap_workload")):
        if run:
            print(f"{run.results['label']} - {run.source}; gradient bytes {run.results['grad_bytes']:,}")
            t = C.overlap_table(run.results["rows"]).assign(buckets=[r["buckets"] for r in run.results["rows"]])
            ch.table(t)
            ch.show(chart, charts.bars(t, "step (ms)", "configuration",
                                       title=f"Step time per configuration ({wl.name}, {run.results['label']})"))
# 2 ranks always: on GPUs when there are 2, else on the CPU (gloo), where the emulated mode shows overlap
else:
    real = _overlap("real")
    gpus = real is not None and real.results.get("backend") == "nccl"     # a GPU record: overlap is real there
    emulated = _overlap("emulated") if (nproc < 2 or not gpus_here) and not gpus else None
for run in (emulated, real):
    if run:
        label = "EMULATED device (timed waits free the CPU)" if run.results["mode"] == "emulated" else "real compute"
        print(f"{label} - {run.source}")
        t = C.overlap_table(run.results["rows"])
        ch.table(t)
        ch.show(f"overlap_{run.results['mode']}", charts.bars(t, "step (ms)", "configuration",
                                                               title=f"Step time per configuration ({label})"))
if emulated or real:
    ch.note("Reading the tables: compute only trains each rank alone (no gradient averaging), so its loss "
            "differs from the data-parallel ones; no_sync over 4 micro-batches updates once per 4, a "
            "different schedule, so its loss differs by design. Only bf16/fp16/PowerSGD change the numerics of "
            "the same schedule. PowerSGD sends ~100x fewer bytes but costs compute (low-rank products) and three "
            "all-reduces per bucket: on a CPU over loopback that is slower; it pays on slow inter-node links. "
            "Differences under ~10 % between runs are noise on a shared 2-core CPU.")
if wl:
    from preflight.chapters import workload as W

    W.add_communication_findings(ch.findings, wov, wem)
else:
    C.add_overlap_findings(ch.findings, emulated, real,
                           "plan-only mode" if not ch.measure else "one device only (needs 2 ranks)")

# %% [markdown]
# ## What changes in 2026 practice
#
# - **Sharded data parallelism (FSDP2, ZeRO-3) moves 1.5x DDP's bytes.** Forward all-gathers each layer's
#   parameters, backward gathers them again and reduce-scatters the gradients: 3·(D−1)/D·S per rank
#   instead of 2·(D−1)/D·S (one dtype throughout; `comm.sharded_bytes_per_rank`). It overlaps by
#   prefetching the next layer's gather. **HSDP** shards inside a node (the gathers stay on NVLink) and
#   all-reduces across nodes: DDP's network traffic with ZeRO-3's memory inside the node.
# - **Overlap is not free.** NCCL kernels occupy SMs (one per channel, typically 16–32 of an H100's 132)
#   and memory bandwidth while they run beside the matmuls, so overlapped compute runs a few percent
#   slower; a hidden all-reduce still costs something.
# - **bf16 gradient reductions: a caveat.** Summing bf16 over many ranks loses bits (8 bits of
#   mantissa). Megatron-LM with bf16 training and torchtitan reduce gradients in fp32 by default (torchtitan
#   sets `mixed_precision_reduce = "float32"`); plain FSDP2 does **not**: a `MixedPrecisionPolicy` with
#   `param_dtype=torch.bfloat16` and no `reduce_dtype` reduces in bf16 (the policy's docstring: "If this
#   is None but param_dtype is not None, then the reduction uses the compute dtype"); fp32 needs
#   `reduce_dtype=torch.float32`. The
#   "send bf16 gradients" fix halves the bytes; check the loss (the real-compute run of §3 shows the
#   drift) before adopting it at 1000+ ranks.
# - **The NVLink domain, not the host, bounds tensor parallelism.** On NVL72 racks (GB200) 72 GPUs share
#   one NVLink domain, so tp (and expert parallelism) can exceed 8. The gap it protects: 450 GB/s of
#   NVLink against 25–50 GB/s per NIC is about **9–18x**, not the "two orders of magnitude" of the
#   saying (that holds for a 25 GbE node NIC shared by 8 GPUs, ~0.4 GB/s each). And 450 GB/s is the line
#   rate: NCCL's rings reach about 370 GB/s bus bandwidth on H100 (the NCCL maintainers, nccl-tests#212).
# - **In-network reduction changes the arithmetic.** With NVLink SHARP (NVLS, NVSwitch 3) the switches add
#   the gradients: an 8-GPU all-reduce reaches ~480 GB/s of nccl-tests' "busbw", 30 % more than rings,
#   and busbw no longer is the bandwidth on the wire; with InfiniBand SHARP each NIC carries the buffer
#   once instead of 2(D−1)/D times. `cluster.in_network` (nvls, sharp) puts it in this chapter's model.
# - **Mixture-of-experts adds all-to-alls.** Every MoE layer sends each token's hidden state to the GPUs
#   of its top-k experts and back: two all-to-alls forward, two backward, `tokens x h x k x 2 B x
#   (ep−1)/ep` each (`preflight.models.moe`). Inside the NVLink domain they are cheap; across nodes they
#   can outweigh the compute (DeepSeek-V3's layout: 17 s of all-to-alls beside 13 s of compute per step if
#   nothing hid them, `docs/moe.md`), which is why DeepSeek limits each token to 4 nodes and overlaps them.
# - **Context parallelism exchanges keys and values.** At long context each of `cp` GPUs holds `s/cp` tokens
#   (its activations divide by cp); every layer its queries must meet all keys: a ring passes each GPU's K/V
#   chunk on while attention of the previous chunk computes (`preflight.models.context`). A transfer grows as
#   `s/cp`, a ring step's attention as `(s/cp)^2`, so the ring hides at long context and is exposed at short
#   context with the same cp. The table below is your model and links at 8K-128K tokens (Llama 3 405B's
#   128K stage used cp=16 and gathered K/V instead of a ring: `docs/context-parallelism.md`).

# %%
ch.table(C.cp_table(prof).round(3))

# %%
ch.table(pd.DataFrame([
    {"scheme": "DDP all-reduce", "GB per rank per step": p["bytes_per_rank"] / 1e9},
    {"scheme": f"FSDP2 full sharding, {prof.training.grad_dtype} throughout",
     "GB per rank per step": comm.sharded_bytes_per_rank(prof.model.params, p["dp"], prof.training.grad_dtype,
                                                         prof.training.grad_dtype, p["tp"], p["pp"]) / 1e9},
    {"scheme": "FSDP2, bf16 parameters, reduce_dtype=torch.float32 (without it: bf16)",
     "GB per rank per step": comm.sharded_bytes_per_rank(prof.model.params, p["dp"], "bf16", "fp32",
                                                         p["tp"], p["pp"]) / 1e9},
]))

# %% [markdown]
# ## 4. Topology
#
# Tensor parallelism all-reduces activations in every layer: its groups must stay inside a node, on
# NVLink. Data parallelism all-reduces once per step and can span nodes; pipeline stages exchange small
# activations point to point. The rules applied to your layout (Megatron-LM's rank order: tensor
# parallel fastest, then data parallel, then pipeline):

# %%
from preflight.diagnose import topology

ch.table(topology.layout_table(prof.cluster.gpus_per_node, prof.cluster.nodes, prof.training.tp, prof.training.pp))
topo = topology.nvidia_smi_topo() if ch.measure and ch.device.is_gpu else None
if topo is not None:
    print("nvidia-smi topo -m on this machine:")
    ch.table(topo.reset_index())
else:
    print("nvidia-smi topo -m: not available here (no NVIDIA GPU). On a GPU node it shows the links "
          "(NV# = NVLink, PIX/PXB = PCIe switch, SYS = across CPU sockets).")
if "NCCL INFO" in nccl_log:
    from preflight.diagnose import nccl_log as nccl
    parsed = nccl.parse_nccl_log(nccl_log)
    print("What NCCL chose for the sweep above (NCCL_DEBUG=INFO):", nccl.nccl_findings_text(parsed))
    ch.table(nccl.nccl_summary(parsed))
ch.note("To see what NCCL really chose, run with `NCCL_DEBUG=INFO` and parse the log: "
        "`preflight.diagnose.nccl_log.parse_nccl_log(text)` gives the transports (P2P/NVLink, SHM, NET/IB with "
        "GPUDirect RDMA, or a fallback to NET/Socket), rings, trees, channels and the path of every peer.")

# %% [markdown]
# ## 5. Mixture of experts: the all-to-all
#
# An MoE layer sends every token's hidden state (h values) to the GPUs of its k experts and back: dispatch
# and combine forward, the same two backward (and the forward pair again under full recompute). With `ep`
# expert-parallel GPUs in d NVLink domains a copy leaves its domain with probability (d−1)/d, so each token
# puts **k·(d−1)/d copies on the network** per all-to-all, k·(ep/d − 1)/ep more on NVLink
# (`preflight.models.moe.a2a_layer`). DeepSeek-V3 (64-way expert parallelism over 8 nodes, top-8) pulls
# three levers:
#
# - **node-limited routing**: a token's experts sit on at most M = 4 nodes; it is sent once to each and
#   forwarded there over NVLink: min(k, M, d)·(d−1)/d copies, **8·7/8 = 7 becomes 4·7/8 = 3.5**;
# - **fp8 dispatch**: the forward dispatch moves 1 + 4/128 bytes per value instead of 2 (the combine and
#   the backward stay bf16);
# - **overlap** (DualPipe): one micro-batch's all-to-alls run under another's compute; only what exceeds
#   that compute shows in the step (the step model's `a2a_s` term; `training.moe_a2a_overlap`).
#
# The tables add the levers one at a time, then vary ep: inside one NVLink domain nothing crosses the
# network. A dense plan has no all-to-all: the section then shows DeepSeek-V3's profile and says so.

# %%
from preflight.chapters import moe_tables as MOE

moe_plan, moe_words = MOE.moe_profile(prof)
moe_key = ch.gpu_key if moe_plan is prof else None       # the example keeps its own GPU
print(f"The all-to-alls of {moe_words}.")

# %%
ask(EX["a2a"])
prediction_a2a = None       # your answer

# %%
A2A_COLUMNS = {"ep": "ep", "domains": "NVLink domains", "routing": "routing", "fp8_dispatch": "fp8 dispatch",
               "overlap": "overlap", "network_copies": "network copies per token", "network_MB": "network MB",
               "nvlink_MB": "NVLink MB", "a2a_all_s": "all-to-all per step (s)",
               "a2a_exposed_s": "exposed per step (s)", "step_s": "step (s)"}
ladder = MOE.a2a_ladder(moe_plan, moe_key)
print("MB per GPU, MoE layer and micro-batch; seconds per step (the step model):")
ch.table(ladder[["lever"] + list(A2A_COLUMNS)].rename(columns=A2A_COLUMNS))
ch.table(MOE.a2a_table(moe_plan, gpu_key=moe_key)[list(A2A_COLUMNS)].rename(columns=A2A_COLUMNS))

# %%
if interactive:
    from IPython.display import display

    from preflight.widgets import a2a_explorer
    display(a2a_explorer(moe_plan, moe_key, label=moe_plan.project))
else:
    print("Sliders: open this chapter in JupyterLab (make lab).")

# %% [markdown]
# ## Check your predictions
#
# The questions you answered before the sliders, computed with the library on your plan: how far off
# were you? The answer stays hidden until you predict (the headless audit shows it).

# %%
check(EX["volume"], prediction_volume, reveal=not interactive)

# %%
check(EX["time"], prediction_time, reveal=not interactive)

# %%
check(EX["a2a"], prediction_a2a, reveal=not interactive)

# %% [markdown]
# ## Your job's traces
#
# The trace answers this chapter's question directly: how much of the communication kernels' time ran
# **under** compute kernels (overlap), and how much of the window the GPU spent communicating with
# nothing else to do (exposed communication: the time overlap did not hide). Per collective type: its
# count, bytes (`In msg nelems` x the element size), group size and an effective bus bandwidth that is
# a *lower bound* (a collective's kernel also waits for its slowest peer). A collective on the compute
# stream cannot overlap anything, and is flagged. NCCL (`ncclKernel_*`, `ncclDevKernel_*` since NCCL
# 2.19) and RCCL kernels are read. Set `traces_dir`; empty shows the embedded example job.

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
# - **Each rank sends 2(D−1)/D × the gradient bytes per step**, nearly independent of D; bf16 halves it.
# - **The time is that volume over the bus bandwidth**, and on rail-optimised nodes the bus bandwidth is
#   the NICs the group has per node, not one NIC: the flat arithmetic holds for one NIC per node only.
# - **Overlap hides the all-reduce behind the backward pass** (about 2/3 of compute); with gradient
#   accumulation only the last micro-batch's backward can hide it.
# - **Measure what the interconnect delivers** (algbw, busbw, an alpha-beta fit) and read the NCCL log for
#   the transport it really chose.

# %%
ch.next_steps()

# %% [markdown]
# Levers: DDP bucket sizes that overlap, bf16 gradient reduction, accumulation with `no_sync()`, tensor
# parallelism inside a node and data parallelism across, one NIC per GPU.
#
# **Next chapter** (the playbook's order, 1 → 3 → 2 → 4 → 5): [Chapter 2: the starved data pipeline →](02_data_pipeline.ipynb).
# All chapters: [README](README.md); terms: [glossary](glossary.md).
