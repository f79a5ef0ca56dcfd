"""The memory-bound share of a step, and the fix measured: operator fusion with ``torch.compile``.

A Transformer block is not only matmuls. GELU, the residual add and LayerNorm each read and write
the whole activation tensor while doing a handful of FLOPs per element: their time is set by memory
bandwidth, not by the tensor cores. Run eagerly, every one of them is a separate kernel with its own
round trip to memory (and more of them in backward). In the field case of the pitfalls brief, GELU
and LayerNorm took ~45 % of a GPU step. More GPUs do not fix that; fusion does: ``torch.compile``
(Inductor) merges the chain of elementwise and reduction ops into a few generated kernels (Triton
on GPU, C++/OpenMP on CPU) that read the tensor once and write it once.

This module measures it on a block built to show the effect::

    x -> Linear -> GELU -> (+ x) -> LayerNorm        (stacked ``layers`` times)

- time eager vs compiled, forward+backward and forward-only (``preflight.core.timing.time_fn``: warm-up,
  synchronised, median of repeats), and the speedup;
- the *memory-bound share*: a ``torch.profiler`` run of each version, operator self-times grouped
  by category with the shared categoriser (``preflight.bench.baseline``), before and after fusion.

How compiled code shows up in a profile (and how it is counted here, ``op_category``):

- Inductor names its kernels ``triton_<kind>_fused_<origin ops>_<n>`` on a GPU and
  ``cpp_fused_<origin ops>_<n>`` on a CPU. ``poi`` (pointwise), ``red`` and ``per`` (reductions) kernels
  are fused elementwise/normalisation chains: **memory_bound**. ``tem`` kernels are templates, a matmul
  or convolution written in Triton: **matmul**. The origin ops in the name say where the work came
  from, not what it is: ``triton_poi_fused_addmm_gelu_0`` is the bias-add + GELU after a library
  matmul, pointwise work. Large matmuls usually stay library calls (``aten::mm``, cuBLAS), which the
  shared categoriser already counts as matmul.
- on a CPU the C++ kernels run inline inside ``## Call CompiledFxGraph <hash>``: that event's *self*
  time is the fused kernels (the matmuls inside it are child ``aten::mm`` events), so it counts as
  **memory_bound** too.
- ``Torch-Compiled Region``, ``CompiledFunction``, ``CompiledFunctionBackward``, ``TorchDynamo Cache
  Lookup``... are containers around the graph. Self times are used (never totals), so only their own
  host overhead is attributed to them, and that is **other**, not kernel work.

What to expect. On a GPU the eager elementwise kernels stream from HBM and the share is large, so is
the gain. On a CPU it is different, and worth seeing: activations of this size sit in a large
last-level cache, the eager GELU and LayerNorm are vectorised library kernels whose cost is the
arithmetic (``erf``), and Inductor's generated code for them is not faster; measured on a 2-core
Xeon, forward+backward gained 0-10 % and forward-only could lose. The first compile takes seconds
(~15 s cold on 2 cores, ~2-4 s with a warm cache; ``TORCHINDUCTOR_CACHE_DIR`` moves the cache).
When compilation is not possible (no C++ compiler, no Triton, unsupported platform) the result says
``available: False`` and why, with the eager figures still measured.

CLI: ``python -m preflight.bench.fusion --out DIR [--quick]`` writes one record (method "fusion").
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from preflight.core.records import Method
from preflight.core.timing import summarize, synchronize, time_fn
from preflight.harness.categories import CATEGORIES, CONTEXT_CATEGORIES, categorize, op_table, profiler_log_filtered

if TYPE_CHECKING:       # torch is imported in the functions that measure: a plan-only audit never loads it
    from torch import nn

METHOD = Method("fusion", 1, required=("available",))


@dataclass(frozen=True)
class FusionConfig:
    tokens: int         # rows of the activation (batch x sequence)
    hidden: int
    layers: int
    dtype: str          # "fp32" or "bf16"
    repeats: int        # timed repeats per measurement
    profile_steps: int  # steps recorded by the profiler

    def as_dict(self) -> dict:
        return asdict(self)


# CPU: a few seconds of timing on 2 cores. GPU: hidden 1024 over 16k tokens, the regime where GELU and
# LayerNorm cost about as much as the h x h matmul (elementwise bytes ~ T h, matmul FLOPs ~ T h^2).
CPU_FUSION = FusionConfig(tokens=4096, hidden=256, layers=4, dtype="fp32", repeats=15, profile_steps=3)
CPU_QUICK = FusionConfig(tokens=1024, hidden=128, layers=2, dtype="fp32", repeats=5, profile_steps=2)
GPU_FUSION = FusionConfig(tokens=16384, hidden=1024, layers=8, dtype="bf16", repeats=30, profile_steps=5)
GPU_QUICK = FusionConfig(tokens=8192, hidden=1024, layers=4, dtype="bf16", repeats=10, profile_steps=3)


def config_for(device, quick: bool = False) -> FusionConfig:
    import torch

    if torch.device(device).type == "cuda":
        return GPU_QUICK if quick else GPU_FUSION
    return CPU_QUICK if quick else CPU_FUSION


def make_stack(cfg: FusionConfig, device) -> nn.Sequential:
    """``cfg.layers`` memory-bound blocks (``reference.MemoryBoundBlock``) in ``cfg.dtype``, seed 0."""
    import torch
    from torch import nn

    from preflight.harness.reference import MemoryBoundBlock

    torch.manual_seed(0)
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
    return nn.Sequential(*[MemoryBoundBlock(cfg.hidden) for _ in range(cfg.layers)]).to(device, dtype)


# --- categories -------------------------------------------------------------------------------------

# Inductor names its kernels triton_<kind>_fused_<origin ops>_<n> (GPU) and cpp_fused_<origin ops>_<n>
# (CPU). <kind> is poi (pointwise), red / per (reductions), tem (a template: a matmul or convolution
# written in Triton). The origin ops are where the work came from, not what it is:
# "triton_poi_fused_addmm_gelu_0" is the bias add + GELU epilogue of a library matmul, pointwise work.
_GENERATED = re.compile(r"^(triton_|cpp_fused|## call compiledfxgraph)", re.IGNORECASE)
_TEMPLATE = re.compile(r"^triton_tem_", re.IGNORECASE)


def op_category(name: str, base: str | None = None) -> str:
    """Category of one profiler op name, aware of compiled code (see the module docstring).

    ``base`` is the shared categoriser's answer (``preflight.harness.categories``; computed when not
    given). Generated kernels become memory_bound (fused elementwise / reduction chains), or matmul
    for Triton templates, unless the shared categoriser already placed them in a phase or kind the name
    makes certain (an all-reduce, an optimizer ``_foreach_`` kernel, flex attention). Everything else,
    the compile wrappers included (their self time is host overhead: 'other'), keeps ``base``.
    """
    if base is None:
        base = categorize(name)
    if _GENERATED.search(name) and base not in CONTEXT_CATEGORIES:
        return "matmul" if _TEMPLATE.search(name) else "memory_bound"
    return base


def category_breakdown(prof, device, steps: int) -> dict:
    """Seconds per step by category, memory-bound share and top ops, from a finished profile.

    The op table is the shared one (``preflight.harness.categories.op_table``: self times, so nested
    events never count twice; host time on the CPU, kernel time on a GPU), re-labelled for compiled
    code by ``op_category``, so these figures compare directly with the single-device baseline's.
    """
    ops = op_table(prof, device)
    ops["category"] = [op_category(o, c) for o, c in zip(ops["op"], ops["category"])]
    ops["time_s"] = ops["time_s"] / steps
    by_cat = ops.groupby("category")["time_s"].sum()
    seconds = {c: float(by_cat.get(c, 0.0)) for c in CATEGORIES}
    total = sum(seconds.values())
    top = ops.groupby(["op", "category"], as_index=False)["time_s"].sum()
    top = top.sort_values("time_s", ascending=False).head(10)
    return {"seconds": seconds,
            "memory_bound_share": seconds["memory_bound"] / total if total > 0 else None,   # None: no op time
            "top_ops": [{"op": o, "category": c, "seconds": float(t)}
                        for o, c, t in zip(top["op"], top["category"], top["time_s"])]}


def profile_categories(fn, device, steps: int) -> dict:
    """Run ``fn`` ``steps`` times under ``torch.profiler`` (after one warm call); ``category_breakdown``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    fn()
    synchronize(device)
    with profiler_log_filtered(), profile(activities=acts, acc_events=True) as prof:   # one cycle; no warning
        for _ in range(steps):
            fn()
        synchronize(device)
    return category_breakdown(prof, device, steps)


# --- the measurement --------------------------------------------------------------------------------

def compile_unavailable_reason(device) -> str | None:
    """Why ``torch.compile`` cannot work here, found before trying (None: worth trying)."""
    import torch

    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    if torch.device(device).type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "Triton is not installed: Inductor cannot generate GPU kernels"
        return None
    if not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++") or shutil.which("c++")):
        return "no C++ compiler found (g++/clang++): Inductor cannot build CPU kernels"
    return None


def interleaved_timings(fns: dict, device, repeats: int, rounds: int = 3) -> dict:
    """``time_fn`` each callable in turn, ``rounds`` times (A B A B ...), pooling the samples.

    On a shared or thermally drifting machine a slow minute then hits every version alike instead of
    whichever happened to be measured during it; the median of the pooled samples is reported.
    """
    per_round = max(1, math.ceil(repeats / rounds))
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            samples[k] += time_fn(fn, device=device, warmup=1, repeats=per_round).samples_s
    return {k: summarize(v) for k, v in samples.items()}


def _inductor_cache_dir() -> str | None:
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return cache_dir()
    except Exception:  # noqa: BLE001 - private helper moved: fall back to the variable
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def measure_fusion(device=None, quick: bool = False) -> dict:
    """Eager vs ``torch.compile`` on the memory-bound block; JSON-able dict.

    Keys: ``available`` (compile worked), ``reason`` (why not, else None), ``device``, ``config``,
    ``eager_fwd_bwd_s`` / ``eager_fwd_s`` and ``compiled_fwd_bwd_s`` / ``compiled_fwd_s`` (median
    seconds per step), ``speedup_fwd_bwd`` / ``speedup_fwd`` (eager / compiled), ``compile_s`` (first
    call of each compiled graph, compilation included), ``tokens_per_s`` (eager, compiled),
    ``memory_bound_share_eager`` / ``memory_bound_share_compiled`` (forward+backward profile),
    ``categories`` (seconds per step per category, each version), ``top_ops``, ``timings`` (median,
    p10, p90 per measurement), ``notes``. Compiled entries are None when ``available`` is False.
    Calls ``torch._dynamo.reset()`` first so repeated calls in one process recompile cleanly.
    """
    import torch

    from preflight.core.device import default_device, probe

    info = probe()
    device = torch.device(device) if device is not None else default_device()   # LOCAL_RANK-aware
    cfg = config_for(device, quick)
    model = make_stack(cfg, device)
    dtype = next(model.parameters()).dtype
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(cfg.tokens, cfg.hidden, generator=gen).to(device, dtype)
    grad_out = torch.randn(cfg.tokens, cfg.hidden, generator=gen).to(device, dtype)

    def fwd_bwd(mod):
        def step():
            model.zero_grad(set_to_none=True)
            mod(x).backward(grad_out)
        return step

    def fwd(mod):
        def step():
            with torch.no_grad():
                mod(x)
        return step

    fns = {"eager_fwd_bwd": fwd_bwd(model), "eager_fwd": fwd(model)}
    eager_prof = profile_categories(fns["eager_fwd_bwd"], device, cfg.profile_steps)

    notes = []
    if device.type == "cpu":
        notes.append(f"measured on the CPU ({torch.get_num_threads()} threads): tensors this size sit in "
                     "cache and eager GELU/LayerNorm are vectorised library kernels, so they are far less "
                     "memory-bound than on a GPU and the fusion gain is small (or none)")
    reason = compile_unavailable_reason(device)
    compile_s: dict = {}
    compiled_prof = None
    if reason is None:
        try:
            torch._dynamo.reset()
            compiled = torch.compile(model)
            for name, make in (("fwd_bwd", fwd_bwd), ("fwd", fwd)):
                t0 = time.perf_counter()
                make(compiled)()          # first call: trace + generate + build the kernels
                synchronize(device)
                compile_s[name] = time.perf_counter() - t0
                fns[f"compiled_{name}"] = make(compiled)
            compiled_prof = profile_categories(fns["compiled_fwd_bwd"], device, cfg.profile_steps)
        except Exception as exc:  # noqa: BLE001 - any compiler/platform failure becomes a reported reason
            reason = "torch.compile failed: " + _first_line(exc)
            compile_s, compiled_prof = {}, None
            fns = {k: v for k, v in fns.items() if k.startswith("eager")}
    timings = {k: t.as_dict() for k, t in interleaved_timings(fns, device, cfg.repeats).items()}
    available = reason is None

    def med(key):
        return timings[key]["median_s"] if key in timings else None

    def ratio(a, b):
        return a / b if a and b else None

    return {
        "available": available,
        "reason": reason,
        "device": info.label if device.type == info.kind else str(device),
        "device_kind": device.type,
        "config": cfg.as_dict(),
        "eager_fwd_bwd_s": med("eager_fwd_bwd"),
        "eager_fwd_s": med("eager_fwd"),
        "compiled_fwd_bwd_s": med("compiled_fwd_bwd"),
        "compiled_fwd_s": med("compiled_fwd"),
        "speedup_fwd_bwd": ratio(med("eager_fwd_bwd"), med("compiled_fwd_bwd")),
        "speedup_fwd": ratio(med("eager_fwd"), med("compiled_fwd")),
        "compile_s": compile_s or None,
        "tokens_per_s": {"eager": cfg.tokens / med("eager_fwd_bwd"),
                         "compiled": cfg.tokens / med("compiled_fwd_bwd") if available else None},
        "memory_bound_share_eager": eager_prof["memory_bound_share"],
        "memory_bound_share_compiled": compiled_prof["memory_bound_share"] if compiled_prof else None,
        "categories": {"eager": eager_prof["seconds"],
                       "compiled": compiled_prof["seconds"] if compiled_prof else None},
        "top_ops": {"eager": eager_prof["top_ops"],
                    "compiled": compiled_prof["top_ops"] if compiled_prof else None},
        "timings": timings,
        "inductor_cache_dir": _inductor_cache_dir(),
        "notes": notes,
    }


def categories_frame(result: dict):
    """Seconds per step by category, eager vs compiled, as a DataFrame (for a bar chart)."""
    import pandas as pd

    rows = []
    for version in ("eager", "compiled"):
        secs = (result.get("categories") or {}).get(version) or {}
        total = sum(secs.values())
        for cat, s in sorted(secs.items()):
            rows.append({"version": version, "category": cat, "seconds": s,
                         "share": s / total if total else math.nan})
    return pd.DataFrame(rows, columns=["version", "category", "seconds", "share"])


def main(argv: list[str] | None = None) -> int:
    from preflight.core.records import save_record

    ap = argparse.ArgumentParser(prog="python -m preflight.bench.fusion", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="results folder for the record")
    ap.add_argument("--quick", action="store_true", help="small sizes (tests, smoke runs)")
    args = ap.parse_args(argv)
    res = measure_fusion(quick=args.quick)
    rec = METHOD.record({"quick": args.quick, "config": res["config"]}, res)
    path = save_record(rec, args.out)
    if res["available"]:
        print(f"fusion: fwd+bwd eager {res['eager_fwd_bwd_s'] * 1e3:.2f} ms, compiled "
              f"{res['compiled_fwd_bwd_s'] * 1e3:.2f} ms, speedup {res['speedup_fwd_bwd']:.2f}x; memory-bound "
              f"share {res['memory_bound_share_eager']:.0%} -> {res['memory_bound_share_compiled']:.0%} -> {path}")
    else:
        print(f"fusion: compile not available ({res['reason']}); eager fwd+bwd "
              f"{res['eager_fwd_bwd_s'] * 1e3:.2f} ms -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
