"""The project profile: the audit's input, a YAML file validated here.

Every field carries its unit in its name or description, an accepted range, and a default where one
makes sense. Bad input raises ``ProfileError`` with one line per problem naming the field, the value
given and what is accepted; the CLI turns that into exit code 2 before anything is written.

Chapters add their own fields here (one schema, one home).
"""
from __future__ import annotations

import re
import reprlib
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from preflight.core.hardware import CHIPS
from preflight.models.activations import RECOMPUTE_MODULES
from preflight.models.states import STAGES


class ProfileError(ValueError):
    """A profile that cannot be used; ``str()`` is the message for the user.

    In a notebook IPython shows ``_render_traceback_`` instead of a traceback through the library: the
    message, every problem at once, and how to check a profile from a terminal."""

    def _render_traceback_(self) -> list[str]:
        return [*str(self).splitlines(), "",
                "Check a profile from a terminal: python -m preflight validate PROFILE (paths are relative to "
                "the folder the notebook runs in: playbook/ for the chapter notebooks)."]


_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxlevel = 60, 60, 40, 4, 4, 2


def _short(value) -> str:
    """``repr`` of a user's value, cut to a readable length (a 1 MB string or a huge list stays one line)."""
    return _SHORT.repr(value)


class _Strict(BaseModel):
    # allow_inf_nan=False: .nan / .inf in YAML (or "nan" strings) are rejected as "not a finite number"
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, v, info: ValidationInfo):
        """YAML reads yes/no/true/false as booleans, and pydantic would take them as 1 and 0."""
        if isinstance(v, bool) and cls.model_fields[info.field_name].annotation not in (bool, bool | None):
            raise ValueError(f"got a boolean ({str(v).lower()}); a number is expected")
        return v


class Model(_Strict):
    params: Annotated[float, Field(ge=1e3, le=1e14, description="parameter count")]
    layers: Annotated[int, Field(ge=1, le=10_000, description="Transformer layers")]
    hidden: Annotated[int, Field(ge=8, le=1_000_000, description="hidden size")]
    seq_len: Annotated[int, Field(ge=1, le=10_000_000, description="sequence length, tokens")]
    heads: Annotated[int | None, Field(ge=1, le=100_000, description="attention heads; empty: hidden / 128 "
                                       "(head size 128), at least 1")] = None
    vocab: Annotated[int, Field(ge=1, le=10_000_000, description="vocabulary size, tokens")] = 32_000
    # The layer's shape and implementation, as the memory planner needs them (preflight.models.activations)
    attention: Literal["flash", "math"] = Field("flash", description="flash: fused attention kernels "
                                                "(FlashAttention, SDPA, cuDNN), no s x s scores kept; math: "
                                                "softmax(q k^T) v written out, keeps them")
    mlp: Literal["gelu", "swiglu"] = Field("gelu", description="gelu: 2 matrices h x ffn (GPT); swiglu: 3 (Llama)")
    ffn_hidden: Annotated[int | None, Field(ge=1, le=10_000_000, description="MLP hidden size; empty: 4 x "
                                            "hidden")] = None
    kv_heads: Annotated[int | None, Field(ge=1, le=100_000, description="key/value heads (grouped-query "
                                          "attention); empty: heads")] = None
    dropout: Annotated[float, Field(ge=0, lt=1, description="dropout probability (GPT-style 0.1; Llama-style "
                                    "0: no dropout masks kept)")] = 0.1
    # Mixture-of-experts (preflight.models.moe): params counts every expert; FLOPs follow the active ones
    experts: Annotated[int, Field(ge=0, le=100_000, description="routed experts per MoE layer; 0: a dense "
                                  "model")] = 0
    top_k: Annotated[int, Field(ge=1, le=1024, description="experts each token is routed to (MoE)")] = 2
    shared_experts: Annotated[int, Field(ge=0, le=1024, description="experts every token goes through (MoE)")] = 0
    expert_ffn_hidden: Annotated[int | None, Field(ge=1, le=10_000_000, description="one expert's MLP hidden "
                                                   "size; empty: ffn_hidden")] = None
    moe_layers: Annotated[int | None, Field(ge=1, le=10_000, description="layers with experts; empty: every "
                                            "layer (DeepSeek-V3: 58 of 61)")] = None
    # Attention's head sizes where they are not hidden / heads: multi-head latent attention (DeepSeek-V2/V3:
    # queries and keys 128 + 64 rotary = 192, values 128, with 128 heads on hidden 7168) computes its scores
    # and its weighted sum at these sizes.
    qk_head_dim: Annotated[int | None, Field(ge=1, le=100_000, description="query/key size per head (MLA: "
                                             "nope + rope, DeepSeek-V3 192); empty: hidden / heads")] = None
    v_head_dim: Annotated[int | None, Field(ge=1, le=100_000, description="value size per head (DeepSeek-V3 "
                                            "128); empty: hidden / heads")] = None
    # MLA's compressed widths (DeepSeek-V3 config.json names): the latents a token keeps when the up
    # projections are recomputed (training.recompute_modules: mla_up_proj), and those projections' FLOPs.
    q_lora_rank: Annotated[int | None, Field(ge=1, le=1_000_000, description="MLA query latent width "
                                             "(DeepSeek-V3 1536)")] = None
    kv_lora_rank: Annotated[int | None, Field(ge=1, le=1_000_000, description="MLA key/value latent width "
                                              "(DeepSeek-V3 512)")] = None
    qk_rope_head_dim: Annotated[int | None, Field(ge=0, le=100_000, description="MLA rotary part of qk_head_dim "
                                                  "(DeepSeek-V3 64), kept beside the key/value latent")] = None

    @property
    def n_heads(self) -> int:
        """``heads``, or hidden / 128 when not given."""
        return self.heads or max(1, self.hidden // 128)

    @property
    def n_kv_heads(self) -> int:
        """``kv_heads``, or all heads (multi-head attention) when not given."""
        return self.kv_heads or self.n_heads

    @property
    def expert_spec(self):
        """The experts as ``preflight.models.moe.Experts``, or None for a dense model."""
        if not self.experts:
            return None
        from preflight.models.moe import Experts

        return Experts(experts=self.experts, top_k=self.top_k, shared=self.shared_experts,
                       expert_ffn=self.expert_ffn_hidden or self.ffn_hidden or 4 * self.hidden,
                       moe_layers=self.moe_layers or self.layers, swiglu=self.mlp == "swiglu")

    @property
    def active_params(self) -> float:
        """Parameters one token computes with: ``params`` for a dense model, less the routed experts it
        does not visit for an MoE (``preflight.models.moe.active_params``)."""
        from preflight.models.moe import active_params

        return active_params(self.params, self.hidden, self.expert_spec)


# Lower bounds are physical, not "> 0": a step of 1e-300 s or a link of 1e-300 GB/s is a typo, and the
# formulas' divisions would overflow to inf. Smallest accepted: 1 us of compute, 1 Mb/s, 0.01 h (36 s) of
# walltime, 1 s checkpoint interval, 100 MB of GPU memory, 1 byte files, 86 s of run.
class Cluster(_Strict):
    gpu: str = Field("H100-SXM", description="key of the hardware table, or 'auto' = this machine")
    gpus_per_node: Annotated[int, Field(ge=1, le=72)] = 8
    nvlink_domain: Annotated[int | None, Field(ge=1, le=576, description="GPUs on one NVLink fabric: tensor-, "
                             "expert- and context-parallel groups inside it run at NVLink speed (GB200/GB300 NVL72: "
                             "72, over 18 nodes of 4); empty: one node (gpus_per_node)")] = None
    nodes: Annotated[int, Field(ge=1, le=100_000)] = 1
    checkpoint_write_GBps: Annotated[float | None, Field(ge=1e-3, le=1e6, description="aggregate file-system write "
                                     "bandwidth the job gets, GB/s: the checkpoint's time C follows from the state's "
                                     "bytes (training.checkpoint_write_s, when given, overrides it)")] = None
    queue_wait_s: Annotated[float, Field(ge=0, le=1e7, description="wait in the queue after each requeue (a "
                                         "failure, an allocation's end) on a shared cluster, s")] = 0.0
    intra_node_GBps: Annotated[float, Field(ge=1e-3, le=100_000, description="per-GPU NVLink-class bandwidth, GB/s, "
                               "one direction: the line rate (H100: 450); the model's rings reach 82 % of it (370 "
                               "GB/s busbw on H100, NCCL maintainers, nccl-tests#212; comm.RING_NVLINK_SHARE) and "
                               "NVLink SHARP 480")] = 450.0
    in_network: Literal["none", "nvls", "sharp", "nvls+sharp"] = Field(
        "none", description="in-network reduction of all-reduces: nvls = NVLink SHARP inside a node (~30 % more "
        "busbw on 8 GPUs), sharp = InfiniBand SHARP across nodes (the buffer crosses each NIC once)")
    inter_node_Gbps: Annotated[float, Field(ge=1e-3, le=100_000, description="bandwidth of one inter-node NIC, "
                                            "Gb/s (bits)")] = 200.0
    nics_per_node: Annotated[int | None, Field(ge=1, le=64, description="inter-node NICs per node; empty: one "
                                               "per GPU (rail-optimised HGX/DGX), 1 = one NIC shared by the "
                                               "node")] = None
    # Default: Llama 3's measured rate (419 interruptions in 54 days on 2,048 nodes: 3.8e-3 per node-day;
    # models.resilience.LLAMA3_P_NODE_DAY, a test keeps them equal); the field report's 1e-4 is a scenario.
    node_failure_per_day: Annotated[float, Field(ge=0, lt=1, description="probability a node fails in a day "
                                                 "(default: Llama 3's measured 3.8e-3; the field report's "
                                                 "1e-4 is 38x lower)")] = 3.78e-3
    walltime_h: Annotated[float, Field(ge=0.01, le=10_000, description="job walltime limit, hours")] = 48.0
    gpu_memory_GB: Annotated[float | None, Field(ge=0.1, le=100_000, description="memory per GPU, GB = 1e9 bytes "
                                                 "(nvidia-smi's MiB x 0.001048576); empty: from the hardware table "
                                                 "(cluster.gpu)")] = None

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str) -> str:
        if v != "auto" and v not in CHIPS:
            raise ValueError(f"unknown GPU {_short(v)}; accepted: auto, {', '.join(CHIPS)}")
        return v


class Training(_Strict):
    # One GPU's share of one optimizer step at the target layout (forward + backward of all its
    # micro-batches), as the team measured it. Empty (the default): the chapters use the step model's
    # prediction (preflight.chapters.step) and say so; stated: the prediction stands beside it and their
    # ratio is judged. Under weak scaling (the default) that is also one GPU's step at every smaller
    # scale; under strong scaling the stated figure is the work that N GPUs share (Amdahl's framing).
    step_compute_s: Annotated[float | None, Field(ge=1e-6, le=1e5, description="measured compute of one GPU's "
                                                  "step at the target layout, s; empty: predicted by the step "
                                                  "model (preflight.chapters.step)")] = None
    step_serial_s: Annotated[float, Field(ge=0, le=1e5, description="serial part of one GPU's step, s")] = 0.09
    scaling: Literal["weak", "strong"] = Field("weak", description="weak: the per-GPU batch is fixed as GPUs are "
                                               "added; strong: the global batch is fixed")
    grad_dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    tp: Annotated[int, Field(ge=1, le=1024, description="tensor-parallel size")] = 1
    pp: Annotated[int, Field(ge=1, le=1024, description="pipeline-parallel size")] = 1
    microbatches: Annotated[int, Field(ge=1, le=100_000)] = 8
    pipeline_schedule: Literal["gpipe", "1f1b", "interleaved"] = "1f1b"
    interleave: Annotated[int, Field(ge=1, le=128, description="model chunks per device")] = 1
    checkpoint_write_s: Annotated[float, Field(ge=0, le=1e6, description="time to write one checkpoint, s")] = 60.0
    run_days: Annotated[float, Field(ge=1e-3, le=3650, description="planned run length, days")] = 30.0
    restart_s: Annotated[float, Field(ge=0, le=1e6, description="time from a failure to training again: detect, "
                                      "restart or requeue, reload the checkpoint, warm up, s")] = 300.0
    micro_batch_size: Annotated[int, Field(ge=1, le=65_536, description="sequences per micro-batch per GPU")] = 1
    zero_stage: Annotated[int, Field(ge=0, le=3, description="ZeRO stage: 0 none, 1 optimizer state, 2 + "
                                     "gradients, 3 + weights sharded over data parallelism")] = 0
    activation_recompute: Literal["none", "selective", "op_selective", "full"] = Field(
        "none", description="none; selective (Megatron: the core attention recomputed); op_selective (torchtitan's "
        "op-level policy: every other matmul and the elementwise ops recomputed); full (each layer's forward again)")
    recompute_modules: list[Literal[RECOMPUTE_MODULES]] | None = Field(
        None, description="with activation_recompute: selective, Megatron's --recompute-modules: what is recomputed "
        "(core_attn, layernorm, mla_up_proj, moe_act, mlp, moe); not given: [core_attn], Megatron's default; "
        "[]: nothing")
    fp8_activation_cache: bool = Field(False, description="with fp8: DeepSeek-V3's low-precision activation storage "
                                       "(report sec. 3.3.3): the inputs the linear layers keep for their backward "
                                       "cached in fp8, the attention output in E5M6, the MoE SwiGLU's input in fp8")
    sequence_parallel: bool = Field(False, description="Megatron sequence parallelism (with tp > 1)")
    framework: Literal["deepspeed", "megatron", "fsdp2", "ddp"] = Field(
        "deepspeed", description="layout of the model states (preflight.models.states): deepspeed 2+2+12 B per "
        "parameter, ZeRO 0-3; megatron 2+4+12, zero_stage 1 = distributed optimizer; fsdp2 4+4+8, zero_stage 3; "
        "ddp (PyTorch DDP with torch.autocast) 4+8+8, 4+4+8 with gradient_as_bucket_view, zero_stage 0")
    gradient_as_bucket_view: bool = Field(False, description="DDP's gradient_as_bucket_view=True: .grad is a view "
                                          "of the all-reduce bucket (4 B per parameter less; framework: ddp)")
    tp_comm_overlap: bool | None = Field(None, description="tensor-parallel communication overlapped with the "
                                         "GEMMs (Megatron-Core --tp-comm-overlap); empty: the framework's default")
    overlap_grad_reduce: bool | None = Field(None, description="gradient reduction overlapped with the backward "
                                             "(Megatron --overlap-grad-reduce, DeepSpeed overlap_comm, DDP and FSDP "
                                             "always); empty: the framework's default")
    overlap_param_gather: bool | None = Field(None, description="weight all-gathers overlapped with compute "
                                              "(Megatron --overlap-param-gather, ZeRO-3 / FSDP prefetch); empty: "
                                              "the framework's default")
    fp8: bool = Field(False, description="FP8 GEMMs (Transformer Engine, torchao): matmuls at the chip's FP8 "
                      "peak, an fp8 copy and transpose of each weight held; MFU stays stated against the bf16 peak")
    fp8_recipe: Literal["delayed", "tensorwise", "rowwise", "blockwise", "mxfp8"] = Field(
        "delayed", description="how fp8 scales (with fp8: true): delayed (Transformer Engine's DelayedScaling), "
        "tensorwise / rowwise (torchao Float8, current scaling), blockwise (DeepSeek-V3's 1x128 / 128x128), mxfp8 "
        "(Blackwell's MX blocks of 32)")
    etp: Annotated[int | None, Field(ge=1, le=1024, description="expert tensor parallelism: how many ways each "
                                     "expert's matrices are split (Megatron's --expert-tensor-parallel-size); empty: "
                                     "tp, Megatron's default")] = None
    moe_a2a_overlap: bool = Field(False, description="MoE all-to-alls overlapped with another micro-batch's compute "
                                  "(DeepSeek-V3's DualPipe, Megatron's --overlap-moe-expert-parallel-comm with the "
                                  "DeepEP / a2a dispatcher)")
    moe_dispatch_fp8: bool = Field(False, description="MoE dispatch in fp8 (1 B per value + a scale per 128; "
                                   "DeepSeek-V3, DeepEP); the combine stays bf16")
    moe_node_limit: Annotated[int | None, Field(ge=1, le=100_000, description="nodes a token's experts may span "
                              "(node-limited routing: DeepSeek-V3 4; Megatron --moe-router-num-groups / "
                              "--moe-router-group-topk); empty: no limit")] = None
    moe_capacity_factor: Annotated[float | None, Field(ge=1.0, le=100.0, description="expert capacity factor: "
                                   "tokens beyond it per expert are dropped (GShard; Megatron "
                                   "--moe-expert-capacity-factor); empty: dropless")] = None
    async_checkpoint: bool = Field(False, description="asynchronous checkpoint saves (Megatron --async-save, "
                                   "torchtitan / DCP async_save): the training stalls only for the blocking part "
                                   "(the copy to host memory)")
    ep: Annotated[int, Field(ge=1, le=100_000, description="expert-parallel size: GPUs a layer's experts are "
                             "spread over, carved out of data parallelism (MoE)")] = 1
    cp: Annotated[int, Field(ge=1, le=1024, description="context-parallel size: GPUs one sequence is split over "
                             "(long context; activations / cp, a key/value exchange per layer)")] = 1
    step_jitter_cv: Annotated[float | None, Field(ge=0, le=1, description="per-rank step-time jitter, standard "
                              "deviation over mean (e.g. 0.02; the traces' step spread measures it); empty: not "
                              "judged, chapter 4 shows what 1-5 % would cost")] = None
    shard_group: Literal["dp", "node"] = Field("dp", description="ZeRO / FSDP sharding group: dp = every data-"
                                               "parallel rank; node = the ranks of one node, replicated across "
                                               "nodes (HSDP)")
    checkpoint_interval_s: Annotated[float | None, Field(ge=1, le=1e7, description="the plan's checkpoint "
                                     "interval, s; empty: not decided (chapter 5 proposes the optimum)")] = None


class Data(_Strict):
    files: Annotated[int, Field(ge=1, le=10**12, description="number of files in the dataset")] = 1
    mean_file_kB: Annotated[float, Field(ge=1e-3, le=1e9, description="mean file size, kB")] = 100_000.0
    storage: Literal["lustre", "gpfs", "nfs", "local_nvme", "object"] = "lustre"
    length_median: Annotated[int, Field(ge=1, le=10_000_000, description="median sample length, tokens (lognormal)")] = 512
    length_sigma: Annotated[float, Field(ge=0, le=5, description="lognormal sigma of sample lengths (0 = all equal)")] = 0.8
    batching: Literal["pad", "bucket", "pack"] = Field("pad", description="how batches are formed: pad = to the "
                                                       "longest sample of each batch (fine-tuning loops); bucket = "
                                                       "by length; pack = samples concatenated into full rows "
                                                       "(pre-training): chapter 4 judges this strategy's padding")
    lengths_file: str = Field("", max_length=4096,
                              description="file of real sample lengths (one integer per line, or a CSV with a "
                                          "'length' column), relative to the profile; replaces the lognormal")
    scratch_dir: str = Field("", max_length=4096,
                             description="absolute folder on the dataset's storage for chapter 2's test "
                                         "dataset (a subfolder preflight-chapter2 is used); empty: .cache/ "
                                         "in the repository")

    @field_validator("scratch_dir")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if v and not Path(v).is_absolute():
            raise ValueError(f"{_short(v)} must be an absolute path (e.g. /lustre/scratch/me), or empty")
        return v


_ENTRY = re.compile(r"^(?:[^:]+\.py|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):[A-Za-z_]\w*$")


class WorkloadEntry(_Strict):
    """The team's own model as the subject of the live measurements (``preflight.core.workload``)."""
    entry: str = Field(max_length=4096, description="'file.py:build' (a file relative to the profile) or "
                                                    "'package.module:build' (importable); build() returns model, "
                                                    "batch and loss (README: Audit your own model)")

    @field_validator("entry")
    @classmethod
    def _entry_form(cls, v: str) -> str:
        if not _ENTRY.match(v):
            raise ValueError(f"{_short(v)} is not an entry point; accepted: 'my_workload.py:build' (a file "
                             "relative to the profile) or 'package.module:build'")
        return v


class Profile(_Strict):
    project: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$",
                         description="report folder name: letters, digits, - and _ (1-64)")
    model: Model
    cluster: Cluster = Cluster()
    training: Training = Training()
    data: Data = Data()
    workload: WorkloadEntry | None = Field(None, description="your own model, measured in every chapter "
                                           "instead of the reference model; empty: the reference model")
    measure: bool = Field(True, description="false = plan-only: formulas on the profile, no live measurement")
    notes: str = Field("", max_length=10_000)

    @model_validator(mode="after")
    def _plan_fits(self) -> Profile:
        gpus = self.cluster.gpus_per_node * self.cluster.nodes
        t = self.training
        if gpus % (t.tp * t.pp * t.cp):
            raise ValueError(f"training.tp * training.pp * training.cp = {t.tp * t.pp * t.cp} must divide the GPU "
                             f"count cluster.gpus_per_node * cluster.nodes = {gpus}")
        if t.cp > 1 and self.model.seq_len % (2 * t.cp):
            raise ValueError(f"training.cp = {t.cp}: model.seq_len = {self.model.seq_len} must be a multiple of 2 x cp "
                             f"= {2 * t.cp} (each GPU holds two chunks, balancing causal attention)")
        if t.cp > 1 and self.model.attention != "flash":
            raise ValueError(f"training.cp = {t.cp} needs model.attention = flash (context parallelism runs in fused "
                             "attention kernels: Transformer Engine, PyTorch's SDPA)")
        if t.cp > 1 and t.framework not in ("megatron", "fsdp2"):
            raise ValueError(f"training.cp = {t.cp}: training.framework = {t.framework} has no ring context parallelism "
                             "(DeepSpeed-Ulysses is an all-to-all over heads, not modelled); accepted: megatron, fsdp2")
        if t.recompute_modules is not None and t.activation_recompute != "selective":
            raise ValueError(f"training.recompute_modules = {t.recompute_modules} needs training.activation_recompute = "
                             f"selective (got {t.activation_recompute!r}): Megatron's --recompute-modules choose what "
                             "selective recompute recomputes")
        mods = t.recompute_modules or []
        if "mla_up_proj" in mods and not (self.model.qk_head_dim and self.model.q_lora_rank and self.model.kv_lora_rank):
            raise ValueError("training.recompute_modules: mla_up_proj needs a multi-head latent attention model "
                             "(model.qk_head_dim, model.q_lora_rank and model.kv_lora_rank set: DeepSeek-V3 192, 1536, "
                             "512)")
        if {"moe_act", "moe"} & set(mods) and not self.model.experts:
            raise ValueError(f"training.recompute_modules = {mods}: moe_act and moe need a mixture-of-experts model "
                             "(model.experts)")
        if {"moe_act", "layernorm"} & set(mods) and t.fp8 and t.fp8_recipe == "delayed":
            raise ValueError(f"training.recompute_modules = {mods} with training.fp8_recipe = delayed: Megatron refuses "
                             "layernorm and moe_act recompute under delayed scaling (transformer_config.py); accepted: "
                             "tensorwise, blockwise or mxfp8, or drop those modules")
        if t.fp8_activation_cache and not t.fp8:
            raise ValueError("training.fp8_activation_cache = true needs training.fp8 = true")
        if t.pipeline_schedule == "interleaved" and t.pp > 1 and t.microbatches % t.pp:
            raise ValueError(f"training.microbatches = {t.microbatches} must be a multiple of training.pp = "
                             f"{t.pp} for the interleaved schedule")
        m = self.model
        if m.hidden % m.n_heads:
            raise ValueError(f"model.heads = {m.n_heads} must divide model.hidden = {m.hidden}")
        if m.n_heads % t.tp:
            raise ValueError(f"training.tp = {t.tp} must divide model.heads = {m.n_heads} (each GPU holds whole heads)")
        if m.n_heads % m.n_kv_heads:
            raise ValueError(f"model.kv_heads = {m.n_kv_heads} must divide model.heads = {m.n_heads}")
        if m.n_kv_heads % t.tp:
            raise ValueError(f"training.tp = {t.tp} must divide model.kv_heads = {m.n_kv_heads} (each GPU holds "
                             "whole key/value heads)")
        stages = STAGES[t.framework]
        if t.zero_stage not in stages:
            raise ValueError(f"training.zero_stage = {t.zero_stage} is not available with training.framework = "
                             f"{t.framework}: accepted {', '.join(map(str, stages))} (megatron: 1 = distributed "
                             "optimizer; fsdp2 always shards weights, gradients and optimizer state: set 3)")
        dp = gpus // (t.tp * t.pp * t.cp)
        if m.experts == 0 and t.ep != 1:
            raise ValueError(f"training.ep = {t.ep}: expert parallelism needs experts (model.experts > 0)")
        if m.experts:
            if m.top_k > m.experts:
                raise ValueError(f"model.top_k = {m.top_k} must be at most model.experts = {m.experts}")
            etp = t.etp or t.tp
            if m.experts % t.ep or (t.tp * dp * t.cp) % (t.ep * etp):
                raise ValueError(f"training.ep = {t.ep} must divide model.experts = {m.experts}, and ep x etp = "
                                 f"{t.ep * etp} the tp x dp x cp = {t.tp * dp * t.cp} ranks of a stage (Megatron's MoE "
                                 "parallel folding: experts spread over the tensor-, data- and context-parallel ranks; "
                                 "training.etp defaults to tp)")
            if (m.moe_layers or 0) > m.layers:
                raise ValueError(f"model.moe_layers = {m.moe_layers} must be at most model.layers = {m.layers}")
            routed = m.expert_spec.routed_params(m.hidden)
            if routed >= m.params:
                raise ValueError(f"model.params = {m.params:.4g} must count every expert: the routed experts alone "
                                 f"hold {routed:.4g} (moe_layers x experts x expert MLP)")
        if t.fp8 and self.cluster.gpu != "auto" and CHIPS[self.cluster.gpu].fp8_tflops is None:
            raise ValueError(f"training.fp8 = true: cluster.gpu = {self.cluster.gpu} has no FP8 tensor cores; "
                             "accepted: a chip with an fp8 peak in `python -m preflight chips` (H100, H200, B200...)")
        if t.framework == "ddp" and (t.tp > 1 or t.pp > 1):
            raise ValueError(f"training.framework = ddp replicates the whole model: tp = {t.tp} and pp = {t.pp} must be "
                             "1 (tensor and pipeline parallelism: megatron or fsdp2)")
        if t.gradient_as_bucket_view and t.framework != "ddp":
            raise ValueError(f"training.gradient_as_bucket_view is DDP's option: training.framework = {t.framework}; "
                             "accepted: ddp")
        if t.pipeline_schedule != "interleaved" and t.interleave != 1:
            raise ValueError(f"training.interleave = {t.interleave} needs pipeline_schedule: interleaved")
        return self

    # Derived quantities: one home, so chapters never recompute them differently.
    @property
    def gpus(self) -> int:
        return self.cluster.gpus_per_node * self.cluster.nodes

    @property
    def dp(self) -> int:
        """Data-parallel size: the replicas of the batch, GPUs / (tp pp cp)."""
        return self.gpus // (self.training.tp * self.training.pp * self.training.cp)

    @property
    def replicas(self) -> int:
        """Ranks holding the same weights: dp x cp (the gradients reduce, and ZeRO shards, over them)."""
        return self.dp * self.training.cp

    @property
    def nics_per_node(self) -> int:
        """``cluster.nics_per_node``, or one NIC per GPU when not given."""
        return self.cluster.nics_per_node or self.cluster.gpus_per_node


def _accepted_range(loc: tuple) -> str:
    """'low .. high' from the schema's bounds for the field at ``loc``, '' when it has none."""
    model: type[BaseModel] | None = Profile
    info = None
    for part in loc:
        if model is None or part not in model.model_fields:
            return ""
        info = model.model_fields[part]
        ann = info.annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    if info is None:
        return ""
    low = high = None
    for m in info.metadata:
        for attr, side in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None:
                if side.startswith(">"):
                    low = f"{side} {v:g}"
                else:
                    high = f"{side} {v:g}"
    return ", ".join(x for x in (low, high) if x)


_MESSAGES = {  # pydantic's wording where it misleads on a YAML file
    "model_type": "expected a section of indented 'field: value' lines (a mapping)",
    "dict_type": "expected a section of indented 'field: value' lines (a mapping)",
    "int_parsing_size": "too large for a whole number",
    "extra_forbidden": "unknown field (check spelling and indentation; see data/profiles/example.yaml)",
    "string_pattern_mismatch": "accepted: letters, digits, - and _ (1 to 64 characters)",
    "missing": "required field missing (see data/profiles/example.yaml)",
}


def _format(err: ValidationError, source: str) -> str:
    lines = [f"invalid profile {source}:"]
    for e in err.errors():
        msg = _MESSAGES.get(e["type"], e["msg"].removeprefix("Value error, "))
        if not e["loc"]:            # a rule across fields (_plan_fits): its message names them
            lines.append(f"  {msg}")
            continue
        field = ".".join(p if isinstance(p, str) and len(p) <= 60 else _short(p) for p in e["loc"])
        value = e.get("input")
        shown = "(missing)" if e["type"] == "missing" else "{...}" if isinstance(value, dict) else _short(value)
        accepted = _accepted_range(e["loc"])
        if accepted and e["type"] not in ("extra_forbidden", "string_pattern_mismatch", "missing"):
            msg += f" (accepted: {accepted})"
        lines.append(f"  {field} = {shown}: {msg}")
    return "\n".join(lines)


def parse_profile(data: object, source: str = "<data>") -> Profile:
    if data is None:
        raise ProfileError(f"invalid profile {source}: the file is empty; expected at least 'project:' and "
                           "'model:' (see data/profiles/example.yaml)")
    if not isinstance(data, dict):
        raise ProfileError(f"invalid profile {source}: expected a YAML mapping ('field: value' lines) at the "
                           f"top level, got {type(data).__name__}")
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        raise ProfileError(_format(err, source) + _rules_beyond(data, err)) from None


def _rules_beyond(data: dict, err: ValidationError) -> str:
    """The rules across fields (``_plan_fits``) that pydantic does not reach while a field is invalid: the
    profile again with the invalid fields left at their defaults, so that every problem is said at once
    (``storage: weka`` and ``tp: 3`` in one message, not one per attempt). '' when none is broken."""
    import copy

    trial = copy.deepcopy(data)
    for e in err.errors():
        if not e["loc"]:
            return ""                   # already a rule across fields: nothing more to learn
        node = trial
        for part in e["loc"][:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and e["loc"][-1] in node:
            del node[e["loc"][-1]]
        elif e["type"] == "missing" or not isinstance(node, dict):
            return ""                   # a required field or a broken section: no defaults to stand in
    try:
        Profile.model_validate(trial)
    except ValidationError as again:
        rules = [e["msg"].removeprefix("Value error, ") for e in again.errors() if not e["loc"]]
        if rules and len(rules) == len(again.errors()):
            return "".join(f"\n  {r} (checked with the fields above at their defaults)" for r in rules)
    return ""


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one section (YAML would keep the last
    silently: a second ``training:`` block would drop the first)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:               # unhashable key: the base class reports it
                    continue
                if first != key_node.start_mark.line + 1:
                    raise _DuplicateKey(None, None, f"key {_short(key)} appears twice in the same section "
                                        f"(lines {first} and {key_node.start_mark.line + 1}); keep one",
                                        key_node.start_mark)
        return super().construct_mapping(node, deep)


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file; ``ProfileError`` on any problem (never a traceback)."""
    p = Path(path)
    try:
        if p.is_dir():
            raise ProfileError(f"profile {p} is a folder; expected a YAML file")
        if not p.exists():
            raise ProfileError(f"profile file not found: {p} (looked for {p.resolve()}; a relative path starts "
                               "in the current folder)")
        raw = p.read_bytes()
    except OSError as err:
        raise ProfileError(f"profile {p} cannot be read: {err.strerror or err}") from None
    except ValueError as err:                   # e.g. a NUL byte in the path
        raise ProfileError(f"profile path {_short(str(path))} is not usable: {err}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ProfileError(f"profile {p} is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); "
                           "save it as UTF-8") from None
    try:
        data = yaml.load(text, Loader=_Loader)   # noqa: S506 - a SafeLoader (plus the duplicate-key check)
    except _DuplicateKey as err:
        raise ProfileError(f"invalid profile {p}: {err.problem}") from None
    except yaml.YAMLError as err:
        raise ProfileError(f"profile {p} is not readable YAML: {err}") from None
    except RecursionError:
        raise ProfileError(f"profile {p} is not readable YAML: nested too deeply to be a profile") from None
    return parse_profile(data, str(p))
