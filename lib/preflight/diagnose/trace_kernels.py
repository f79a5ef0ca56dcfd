"""What a GPU event in a profiler trace is: its class (by the kernel's name) and, for the ops the trace
recorded shapes of, how many floating-point operations it did.

**Classes** (the kernel time split of chapter 1, and what counts as communication in chapter 3):

- ``comm``: NCCL and RCCL collectives and point-to-point (``ncclKernel_*``, ``ncclDevKernel_*``
  since NCCL 2.19, whose names no longer say the collective, RCCL's ``ncclKernel``/``rccl`` names),
  and the one-sided kernels MoE layers exchange tokens with: DeepEP's ``deep_ep::*`` dispatch / combine
  (an all-to-all) and NVSHMEM's ``nvshmem*``;
- ``matmul``: GEMMs and convolutions and attention, on cuBLAS / cuBLASLt (``gemm``, ``nvjet``,
  ``cutlass``, ``xmma``), cuDNN (``conv``, ``dgrad``, ``wgrad``), flash / memory-efficient attention
  (``flash``, ``fmha``), Triton templates (``triton_tem_``, ``triton_mm``) and ROCm's Tensile
  (``Cijk_``);
- ``memory``: everything else a kernel does: elementwise, normalisation, softmax, reductions, Triton's
  fused pointwise / reduction kernels (``triton_poi_``, ``triton_per_``, ``triton_red_``): work bound
  by memory bandwidth, not by the tensor cores;
- ``copy``: memcpy and memset (their own trace category, ``gpu_memcpy`` / ``gpu_memset``).

**FLOPs from shapes** (``record_shapes=True``): the formulas of ``torch.utils.flop_counter`` (PyTorch
2.13) on the recorded ``Input Dims``: a matmul ``[M, K] @ [K, N]`` is ``2MKN``; ``bmm`` adds the batch;
attention forward is two batched matmuls, ``4 B H L S E``, its backward five (2.5x the forward: the
scores are recomputed); a convolution is ``2 x output elements x (C/groups) x kernel volume``, its
backward twice that (input and weight gradients); fp8 ``_scaled_mm`` is a matmul; a grouped GEMM
(``_grouped_mm``, MoE experts) is ``2 x (rows of all groups) x K x N``; Transformer Engine 1.x's
``tex_ts::te_gemm_ts`` is ``2 |D| K`` with ``K = sqrt(|A| |B| / |D|)`` from its A, B, D shapes (exact
whatever the transposes). Triton templates (``triton_tem_*``) and Transformer Engine 2.x GEMMs run
under no op with shapes: their time is matmul time without FLOPs, and the trace-quality share of
matmul time with countable FLOPs says how much MFU leaves out. Only the leaf ops are counted (``aten::mm``, not the
``aten::linear`` or ``aten::matmul`` that call it), so nothing is counted twice. Attention is counted
non-causal (as ``flop_counter`` does; a causal kernel skips about half).
"""
from __future__ import annotations

import math
import re

CLASSES = ("matmul", "memory", "comm", "copy")
CLASS_LABEL = {"matmul": "matmul / conv / attention", "memory": "memory-bound (elementwise, norm, softmax...)",
               "comm": "communication", "copy": "memcpy / memset"}

_COMM = re.compile(r"nccl|rccl|^c10d::|all_?reduce|all_?gather|reduce_?scatter|alltoall|sendrecv|deep_ep|nvshmem",
                   re.IGNORECASE)
_MATMUL = re.compile(r"gemm|gemv|nvjet|cutlass|xmma|cublas|cudnn.*conv|conv(?:olution)?\w*kernel|implicit_convolve"
                     r"|dgrad|wgrad|fprop|winograd|flash|fmha|attention|triton_tem_|triton_mm|triton_bmm|^Cijk_"
                     r"|sm\d+_xmma|_mma_|wmma|hgemm|sgemm|bgemm", re.IGNORECASE)
# the collective a communication kernel runs, from its name (NCCL < 2.19) or its arguments (PyTorch >= 2.1)
_COLL = re.compile(r"(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv|AllToAll)", re.IGNORECASE)
_COLL_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
               "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send_recv", "send": "send_recv",
               "recv": "send_recv", "alltoall": "all_to_all", "all_to_allv": "all_to_all",
               "_allgather_base": "all_gather", "_reduce_scatter_base": "reduce_scatter",
               "allgather_into_tensor_coalesced": "all_gather", "reduce_scatter_tensor_coalesced": "reduce_scatter",
               "allreduce_coalesced": "all_reduce", "alltoall_base": "all_to_all", "barrier": "barrier",
               "gather": "gather", "scatter": "scatter"}

# bytes of one element, by the dtype names the traces use ("Float" in collectives, "c10::BFloat16" in ops)
DTYPE_BYTES = {"float": 4, "double": 8, "half": 2, "bfloat16": 2, "long": 8, "int": 4, "short": 2, "byte": 1,
               "char": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1,
               "float8_e5m2fnuz": 1, "unsigned char": 1, "signed char": 1, "c10::half": 2, "c10::bfloat16": 2,
               "int64_t": 8, "int32_t": 4, "float32": 4, "float16": 2, "int8": 1, "uint8": 1, "int64": 8}
# the peak of the hardware table a matmul in this input dtype is held against (fp32: TF32, the precision
# cuDNN convolutions run in by default and matmuls do under set_float32_matmul_precision("high"))
PEAK_DTYPE = {"bf16": "bf16", "fp16": "fp16", "fp32": "tf32", "fp8": "fp8"}


def kernel_class(name: str, cat: str = "kernel") -> str:
    """``comm``, ``matmul``, ``memory`` or ``copy`` for a GPU event (see the module's docstring)."""
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "copy"
    if _COMM.search(name):
        return "comm"
    if _MATMUL.search(name):
        return "matmul"
    return "memory"


def collective_type(name: str, collective_arg: str | None = None) -> str:
    """The collective a communication event runs: ``all_reduce``, ``all_gather``, ``reduce_scatter``,
    ``broadcast``, ``send_recv``, ``all_to_all``...; ``unknown`` for an ``ncclDevKernel_Generic`` without
    the ``Collective name`` argument PyTorch adds."""
    if collective_arg:
        key = collective_arg.lower().replace(" ", "")
        return _COLL_NAMES.get(key, key)
    if "deep_ep" in name.lower():
        return "all_to_all"                     # MoE dispatch / combine: tokens to and from every expert's rank
    tail = name.split(":", 1)[1] if name.startswith(("gloo:", "nccl:")) else name
    m = _COLL.search(tail.replace("_", ""))
    return _COLL_NAMES.get(m.group(1).lower(), "unknown") if m else "unknown"


def dtype_bytes(dtype: str | None) -> int | None:
    return DTYPE_BYTES.get(str(dtype).lower()) if dtype else None


def short_dtype(type_name: str) -> str | None:
    """'c10::BFloat16' -> 'bf16', 'c10::Half' -> 'fp16', 'float' -> 'fp32'; None for others."""
    t = type_name.lower()
    if "bfloat16" in t:
        return "bf16"
    if "half" in t or t == "float16":
        return "fp16"
    if "float8" in t:
        return "fp8"
    if t in ("float", "float32"):
        return "fp32"
    return None


def _prod(xs) -> int:
    return math.prod(int(x) for x in xs)


def _conv_flops(x, w, out_spatial) -> int:
    """2 x N x O x prod(out spatial) x (C/groups) x prod(kernel): C/groups is the weight's dim 1."""
    return 2 * int(x[0]) * int(w[0]) * _prod(out_spatial) * _prod(w[1:])


def _conv_out(x, w, concrete) -> list[int] | None:
    """Output spatial size of a convolution from its input, weight and the stride / padding / dilation
    that ``Concrete Inputs`` records (PyTorch >= 2.1); None when they are not recorded."""
    try:
        stride, pad, dil = (eval_list(concrete[i]) for i in (3, 4, 5))
    except (IndexError, ValueError, TypeError):
        return None
    k = w[2:]
    n = len(k)
    if not (len(stride) in (1, n) and len(pad) in (1, n) and len(dil) in (1, n)):
        return None
    pick = (lambda v, i: int(v[0] if len(v) == 1 else v[i]))
    return [(int(x[2 + i]) + 2 * pick(pad, i) - pick(dil, i) * (int(k[i]) - 1) - 1) // pick(stride, i) + 1
            for i in range(n)]


def eval_list(text) -> list[int]:
    """'[1, 1]' (as ``Concrete Inputs`` writes a list) -> [1, 1]."""
    if isinstance(text, list):
        return [int(v) for v in text]
    return [int(v) for v in re.findall(r"-?\d+", str(text))]


def op_flops(name: str, dims: list, concrete: list | None = None) -> int | None:
    """Floating-point operations of one ``aten::`` op from its recorded input shapes, or None when the
    op is not a counted leaf op (or its shapes are missing)."""
    try:
        if name == "aten::mm":
            (m, k), (_, n) = dims[0], dims[1]
            return 2 * m * k * n
        if name == "aten::addmm":
            (m, k), (_, n) = dims[1], dims[2]
            return 2 * m * k * n
        if name in ("aten::bmm", "aten::baddbmm"):
            a, b = (dims[0], dims[1]) if name == "aten::bmm" else (dims[1], dims[2])
            return 2 * a[0] * a[1] * a[2] * b[2]
        if name in ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
                    "aten::_scaled_dot_product_cudnn_attention"):
            q, k, v = dims[0], dims[1], dims[2]
            return 2 * q[0] * q[1] * q[2] * k[2] * (q[3] + v[3])
        if name in ("aten::_scaled_dot_product_flash_attention_backward",
                    "aten::_scaled_dot_product_efficient_attention_backward",
                    "aten::_scaled_dot_product_cudnn_attention_backward"):
            q, k, v = dims[1], dims[2], dims[3]          # (grad_out, query, key, value, ...)
            fwd = 2 * q[0] * q[1] * q[2] * k[2] * (q[3] + v[3])
            return fwd * 5 // 2
        if name == "aten::_scaled_mm":
            (m, k), (_, n) = dims[0], dims[1]
            return 2 * m * k * n
        if name in ("aten::_grouped_mm", "aten::_scaled_grouped_mm"):
            return _grouped_flops(dims[0], dims[1])
        if name == "tex_ts::te_gemm_ts":
            return _te_flops(dims)
        if name == "aten::convolution":
            x, w = dims[0], dims[1]
            out = _conv_out(x, w, concrete or [])
            return _conv_flops(x, w, out) if out else None
        if name == "aten::convolution_backward":
            g, _x, w = dims[0], dims[1], dims[2]        # grad_output carries the output size
            return 2 * _conv_flops(g, w, g[2:])
    except (IndexError, TypeError, ValueError):
        return None
    return None


def _grouped_flops(a, b) -> int | None:
    """A grouped GEMM: [rows of all groups, K] x [G, K, N]; [G, M, K] x [G, K, N]; [M, K of all] x [K of all, N]."""
    if len(a) == 2 and len(b) == 3:
        return 2 * a[0] * a[1] * b[2]
    if len(a) == 3 and len(b) == 3:
        return 2 * a[0] * a[1] * a[2] * b[2]
    if len(a) == 2 and len(b) == 2:
        return 2 * a[0] * a[1] * b[1]
    return None


def _te_flops(dims) -> int | None:
    """Transformer Engine 1.x's GEMM op: its first three 2-D shapes are A, B and the output D."""
    two = [d for d in dims if isinstance(d, list) and len(d) == 2][:3]
    if len(two) < 3 or not all(x > 0 for d in two for x in d):
        return None
    a, b, d = (math.prod(x) for x in two)
    k = math.isqrt(a * b // d) if a * b % d == 0 else None
    return 2 * d * k if k and k * k * d == a * b else None


FLOP_OPS = frozenset({
    "aten::_scaled_mm", "aten::_grouped_mm", "aten::_scaled_grouped_mm", "tex_ts::te_gemm_ts",
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::convolution", "aten::convolution_backward",
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_flash_attention_backward",
    "aten::_scaled_dot_product_efficient_attention_backward", "aten::_scaled_dot_product_cudnn_attention_backward"})
