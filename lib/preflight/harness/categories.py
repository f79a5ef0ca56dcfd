"""Where the time of a step goes, by kind of work: profiler ops grouped into categories.

``categorize`` is a pure function of an op name; ``event_category`` adds the call-stack context
(an optimizer's ``mul_`` is optimizer time); ``op_table`` turns a finished ``torch.profiler`` run
into self times per op (so nested ops never count twice) and ``category_table`` sums them.

Why these categories: matmuls and attention are compute-bound and scale with FLOP rate;
elementwise ops, norms, activations, softmax, copies, embedding lookups and loss pieces move more
bytes than they compute and are *memory-bound*: more GPUs do not make them faster, fusion does.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from contextlib import contextmanager

CATEGORIES = ("matmul", "attention", "memory_bound", "communication", "data", "optimizer", "other")

# torch.profiler's C++ side (kineto) prints progress lines to stderr at start and stop; a CUDA build of
# torch on a machine without a usable driver (code 35) also prints an error line there, although the
# run is simply on the CPU (which the chapter says). Both are dropped; every other line passes.
_KINETO_LOG = re.compile(r"^(USDT|STAGE):\d{4}-\d\d-\d\d |^ERROR:\d{4}-\d\d-\d\d .*\] gpuGetDeviceCount failed")


@contextmanager
def profiler_log_filtered():
    """Around a ``torch.profiler`` run: drop kineto's 'USDT:'/'STAGE:' lines from the process's
    stderr (red noise in a notebook) and pass every other line through, after the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines = tmp.read().decode(errors="replace").splitlines(keepends=True)
            rest = "".join(line for line in lines if not _KINETO_LOG.match(line))
            if rest:
                sys.stderr.write(rest)


_COMM = re.compile(r"nccl|gloo|c10d|record_param_comms|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all")
_MATMUL = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "addmv", "mv", "dot", "vdot",
           "einsum", "scaled_mm", "addmm_activation", "int_mm", "tensordot",
           # convolutions: compute-bound like matmuls (a CNN workload's main work)
           "convolution", "conv1d", "conv2d", "conv3d", "mkldnn_convolution", "cudnn_convolution",
           "slow_conv2d_forward", "slow_conv2d", "thnn_conv2d", "convolution_overrideable"}
_MEMORY_BOUND = {
    "layer_norm", "native_layer_norm", "rms_norm", "fused_rms_norm", "group_norm", "native_group_norm",
    "batch_norm", "native_batch_norm", "gelu", "relu", "silu", "sigmoid", "tanh", "softplus", "threshold",
    "leaky_relu", "elu", "glu", "mish", "hardtanh", "softmax", "log_softmax", "dropout", "native_dropout",
    "fused_dropout", "bernoulli", "cross_entropy_loss", "cross_entropy", "nll_loss", "nll_loss_forward",
    "nll_loss2d_forward", "mse_loss", "add", "sub", "rsub", "mul", "div", "neg", "exp", "log", "pow", "sqrt",
    "rsqrt", "abs", "clamp", "where", "masked_fill", "lerp", "addcmul", "addcdiv", "reciprocal", "maximum",
    "minimum", "fill", "zero", "copy", "to_copy", "to", "clone", "contiguous", "cat", "stack",
    "index_select", "gather", "scatter", "scatter_add", "index", "index_put", "embedding",
    "embedding_dense", "sum", "mean", "amax", "max", "min", "var", "std", "cumsum", "tril", "triu",
    "ones_like", "zeros_like", "unsafe_split", "split_with_sizes_copy",
}


def _normalise(name: str) -> str:
    """'aten::native_layer_norm_backward' -> 'native_layer_norm'; 'AddmmBackward0' -> 'addmm'."""
    base = name.split("::")[-1].split(": ")[-1].strip()
    base = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", base).lower()     # CamelCase autograd nodes
    base = re.sub(r"_?backward(0|_data|_input|_weight)?$", "", base)
    return base.strip("_")


def categorize(op_name: str) -> str:
    """Category of one profiler op name: one of ``CATEGORIES``. A pure function of the name.

    Phases before kernels (an op in the optimizer step is 'optimizer' whatever it computes; see
    ``event_category`` for that context rule), then kernels by what bounds them: matmuls and
    attention are compute-bound, elementwise ops, norms, activations, softmax, copies, embedding
    lookups and loss pieces are memory-bound. Views, allocation and launch overhead are 'other'.
    """
    low = op_name.lower()
    if _COMM.search(low):
        return "communication"
    if "dataloader" in low or "data_wait" in low or "pin_memory" in low:
        return "data"
    if "optimizer" in low or "_foreach_" in low or "zero_grad" in low or re.search(r"fused_(adam|sgd)", low):
        return "optimizer"
    if "attention" in low or "scaled_dot_product" in low or "sdpa" in low or "flash" in low:
        return "attention"
    base = _normalise(op_name)
    if base in _MATMUL or "gemm" in low or "cublas" in low:
        return "matmul"
    if base in _MEMORY_BOUND or re.search(r"(layer|rms|group|batch)_?norm|elementwise|reduce_kernel", low):
        return "memory_bound"
    return "other"


# Categories a name makes certain, whatever the op computes (a phase, or attention as a whole).
CONTEXT_CATEGORIES = ("data", "optimizer", "communication", "attention")


def event_category(evt) -> str:
    """Category of a profiler event *in its call stack*: the outermost enclosing data / optimizer /
    communication / attention region wins (AdamW's ``mul_`` is optimizer time, not memory-bound
    model time); otherwise the op's own category; an uncategorised op (a view, an allocation)
    takes that of its nearest categorised caller (``aten::t`` inside ``aten::linear`` is matmul)."""
    outer, p = None, evt.cpu_parent
    while p is not None:
        if categorize(p.name) in CONTEXT_CATEGORIES:
            outer = categorize(p.name)
        p = p.cpu_parent
    if outer:
        return outer
    own, p = categorize(evt.name), evt.cpu_parent
    while own == "other" and p is not None:
        own, p = categorize(p.name), p.cpu_parent
    return own


def op_table(prof, device):
    """Self time per (op, category), seconds, largest first. CPU: self CPU time. GPU: self device
    (kernel) time of each op, so nested ops never count twice; kernels no op claims go to 'other'."""
    import pandas as pd
    import torch
    from torch.autograd import DeviceType

    gpu = torch.device(device).type == "cuda"
    rows: dict[tuple[str, str], float] = {}
    claimed = kernels = 0.0
    for evt in prof.events():
        if evt.device_type != DeviceType.CPU:                 # a kernel: also listed under its op
            # record_function ranges ("forward", "Optimizer.step#...") have a device-side copy that
            # spans many kernels: not a kernel (torch's own tables skip them too)
            if gpu and not getattr(evt, "is_user_annotation", False) and not getattr(evt, "is_async", False):
                kernels += evt.time_range.elapsed_us()
            continue
        us = evt.self_device_time_total if gpu else evt.self_cpu_time_total
        if us > 0:
            key = (evt.name, event_category(evt))
            rows[key] = rows.get(key, 0.0) + us
            claimed += us
    if gpu and kernels > claimed:
        rows[("(kernels without a CPU op)", "other")] = kernels - claimed
    df = pd.DataFrame([{"op": k[0], "category": k[1], "time_s": v / 1e6} for k, v in rows.items()],
                      columns=["op", "category", "time_s"])
    return df.sort_values("time_s", ascending=False, ignore_index=True)


def category_table(ops):
    """Per category: time_s and share of all op time (shares sum to 1), in ``CATEGORIES`` order."""
    import pandas as pd

    t = ops.groupby("category")["time_s"].sum() if len(ops) else {}
    total = float(sum(t.values)) if len(ops) else 0.0
    return pd.DataFrame([{"category": c, "time_s": float(t.get(c, 0.0)),
                          "share": float(t.get(c, 0.0)) / total if total else 0.0} for c in CATEGORIES])
