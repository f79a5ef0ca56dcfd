"""Chapter 1 on your own model: the single-device baseline of a profile's workload.

The same three layers as the reference baseline (``preflight.bench.baseline``), measured on the
workload's own training step (``preflight.core.workload``: ``loss(model(inputs), targets)``, backward,
its optimizer), with its own batches:

- **what it is**: parameters, counted exactly; the FLOPs of one training step (forward + backward)
  counted by ``torch.utils.flop_counter.FlopCounterMode``, per sample. Only where the model is a
  Transformer built from ``torch.nn`` attention layers (``nn.MultiheadAttention``) and the workload
  says how many tokens a sample has, the ``6N + 12 L h s`` formula is shown beside the count;
- **business**: samples/s (tokens/s with ``tokens_per_sample``) from the median step;
- **framework**: the step's composition (data wait / forward / backward / optimizer / other) and a
  ``torch.profiler`` op table in categories, with the memory-bound share;
- **hardware**: MFU from the *counted* FLOPs against the datasheet peak (fp32: the step runs in the
  workload's own precision) and against the measured fp32 matmul ceiling;
- **memory**: weights, gradients and optimizer state after a step (bytes, exact), the activations
  autograd saves per sample (``SavedTensors``), the allocator peak on a GPU (on a CPU their sum, a
  lower bound).

``measure_fusion`` (method ``workload_fusion``): eager against ``torch.compile`` of the workload's
own forward + backward, interleaved timings, memory-bound share of each: does fusion help *your*
model? Both take a built ``Workload``; the chapter runs them through ``Chapter.workload_measurement``
so each record names the workload it measured.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from preflight.bench.baseline import _cpu_attention_mapping
from preflight.bench.ceilings import matmul_rate
from preflight.core import hardware
from preflight.core.device import default_device, device_name, on_device, torch_fp32_precision
from preflight.core.records import Method
from preflight.core.timing import StepTimer, synchronize
from preflight.core.workload import Workload, samples_in, to_device
from preflight.harness.categories import category_table, op_table, profiler_log_filtered
from preflight.harness.nvml import NvmlSampler
from preflight.harness.savedtensors import SavedTensors
from preflight.models.flops import mfu, train_flops_per_token

if TYPE_CHECKING:       # torch is imported in the functions that measure: a plan-only audit never loads it
    import torch

METHOD = Method("workload_baseline", 1, required=("workload", "params", "flops", "throughput", "composition",
                                                  "mfu", "memory"))
FUSION = Method("workload_fusion", 1, required=("workload", "available"))


def transformer_shape(model: torch.nn.Module) -> dict | None:
    """Layers and hidden size when the model is built from ``nn.MultiheadAttention`` layers, else None."""
    import torch

    attn = [m for m in model.modules() if isinstance(m, torch.nn.MultiheadAttention)]
    return {"layers": len(attn), "hidden": attn[0].embed_dim} if attn else None


def count_flops(wl: Workload, x, y) -> dict:
    """FLOPs of one forward + backward of one batch, counted op by op; per sample; the Transformer
    formula beside it where it applies (N without embedding tables, s = tokens_per_sample)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=_cpu_attention_mapping()) as fc:
        wl.step_loss(x, y).backward()
    wl.model.zero_grad(set_to_none=True)
    samples = samples_in(x)
    counted = float(fc.get_total_flops())
    out = {"counted_per_step": counted, "per_sample": counted / samples, "samples_per_step": samples,
           "counted_by_op": {str(k): int(v) for k, v in fc.get_flop_counts()["Global"].items()},
           "formula_per_sample": None, "transformer": None}
    shape = transformer_shape(wl.model)
    if shape and wl.tokens_per_sample:
        emb = sum(m.weight.numel() for m in wl.model.modules() if isinstance(m, torch.nn.Embedding))
        n = wl.params - emb
        s = wl.tokens_per_sample
        out["transformer"] = {**shape, "seq_len": s, "params_no_embeddings": n}
        out["formula_per_sample"] = train_flops_per_token(n, shape["layers"], shape["hidden"], s) * s
        out["ratio_counted_to_formula"] = out["per_sample"] / out["formula_per_sample"]
    return out


def state_bytes(wl: Workload, opt, x, y) -> dict:
    """Bytes of weights, gradients and optimizer state (after a step), and of the activations one
    forward saves for backward (each storage once, model state excluded), also per sample."""
    import torch

    with SavedTensors(exclude=wl.model) as saved:
        loss = wl.step_loss(x, y)
    del loss
    params = list(wl.model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    grads = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    optim = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    buffers = sum(b.numel() * b.element_size() for b in wl.model.buffers())
    return {"weights": weights, "gradients": grads, "optimizer_state": optim, "buffers": buffers,
            "model_states": weights + grads + optim, "bytes_per_param": (weights + grads + optim) / wl.params,
            "saved_activations": saved.total_bytes, "activations_per_sample": saved.total_bytes / samples_in(x)}


def _step(wl: Workload, opt, dev, timer: StepTimer):
    import torch

    rf = torch.profiler.record_function
    with timer.phase("data_wait"), rf("data_wait"):
        inputs, targets = wl.batch()
        x, y = to_device(inputs, dev), to_device(targets, dev)
    with timer.phase("forward"), rf("forward"):
        loss = wl.step_loss(x, y)
    with timer.phase("backward"), rf("backward"):
        loss.backward()
    with timer.phase("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)
    timer.end_step()
    return loss.detach()


def _profile(wl, opt, dev, n: int):
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    try:
        with profiler_log_filtered(), profile(activities=acts, acc_events=True) as prof:
            for _ in range(n):
                _step(wl, opt, dev, StepTimer(dev))
            synchronize(dev)
        ops = op_table(prof, dev)
    except RuntimeError as err:
        return None, f"torch.profiler failed: {err}"
    return (ops, None) if len(ops) else (None, "torch.profiler recorded no op time")


def measure_baseline(wl: Workload, device=None, quick: bool = False) -> dict:
    """Train the workload on one device; JSON-able results (keys in the module docstring's order)."""
    import torch

    t_start = time.perf_counter()
    dev = torch.device(device) if device is not None else default_device()
    gpu = dev.type == "cuda"
    warmup, steps, prof_steps = (2, 6, 2) if quick else ((5, 20, 3) if gpu else (3, 10, 3))
    with on_device(dev):
        wl.model.to(dev).train()
        opt = wl.make_optimizer()
        timer = StepTimer(dev)
        for _ in range(warmup):
            _step(wl, opt, dev, timer)
        if gpu:
            torch.cuda.reset_peak_memory_stats(dev)
        with NvmlSampler(dev) as nv:
            for _ in range(steps):
                loss = _step(wl, opt, dev, timer)
        peak_alloc = torch.cuda.max_memory_allocated(dev) if gpu else None
        ops, prof_reason = _profile(wl, opt, dev, prof_steps)
        inputs, targets = wl.batch()
        x, y = to_device(inputs, dev), to_device(targets, dev)
        flops = count_flops(wl, x, y)
        mem = state_bytes(wl, opt, x, y)
        ceiling = matmul_rate(dev, dtype="fp32", n=(4096 if gpu else 512) if quick else None)
    frame = timer.frame(skip=warmup)
    step_s = float(frame["total"].median())
    samples = flops["samples_per_step"]
    tokens = wl.tokens_per_sample
    cats = category_table(ops) if ops is not None else None
    name = device_name(dev) if gpu else None
    precision = torch_fp32_precision(wl.model)   # TF32 matmuls / cuDNN convolutions: that peak
    peak = hardware.peak_tflops(name, precision["peak_dtype"])
    achieved = flops["counted_per_step"] / step_s
    lower_bound = mem["model_states"] + mem["buffers"] + mem["saved_activations"]
    return {
        "workload": wl.describe(), "device": str(dev), "device_name": name, "quick": quick,
        "params": wl.params, "params_trainable": sum(p.numel() for p in wl.model.parameters() if p.requires_grad),
        "samples_per_step": samples, "tokens_per_sample": tokens,
        "step_time_s": step_s, "samples_per_s": samples / step_s,
        "tokens_per_s": samples * tokens / step_s if tokens else None,
        "flops_per_sample": flops["per_sample"],
        "memory_bound_share": (float(cats.set_index("category").loc["memory_bound", "share"])
                               if cats is not None else None),
        "throughput": {"warmup_steps": warmup, "steps": steps, "step_time_s": step_s,
                       "step_time_p10_s": float(frame["total"].quantile(0.1)),
                       "step_time_p90_s": float(frame["total"].quantile(0.9)),
                       "samples_per_s": samples / step_s, "tokens_per_s": samples * tokens / step_s if tokens else None,
                       "step_time_basis": "median step of the phase timer (synchronised at phase boundaries)"},
        "composition": timer.composition(skip=warmup).to_dict("records"),
        "categories": cats.to_dict("records") if cats is not None else None,
        "top_ops": ops.head(15).to_dict("records") if ops is not None else None,
        "profile": {"available": ops is not None, "reason": prof_reason, "steps": prof_steps},
        "flops": flops,
        "mfu": {"achieved_tflops": achieved / 1e12, "flops_basis": "FlopCounterMode count of one step / median step",
                "dtype": "fp32", "precision": precision, "peak_dtype": precision["peak_dtype"],
                "datasheet_peak_tflops": peak, "mfu_datasheet": mfu(achieved, peak),
                "peak_note": (f"{hardware.lookup(name).source}, dense {precision['peak_dtype']} (fp32 workload; "
                              f"matmul precision {precision['float32_matmul_precision']!r}, cuDNN TF32 "
                              f"{'on' if precision['cudnn_allow_tf32'] else 'off'})" if peak else
                              f"unknown peak: {name or 'the CPU'} has no {precision['peak_dtype']} entry in "
                              "preflight.core.hardware"),
                "measured_ceiling_tflops": ceiling["tflops"], "mfu_measured_ceiling": mfu(achieved, ceiling["tflops"])},
        "memory": {"peak_GB": (peak_alloc if gpu else lower_bound) / 1e9, "is_lower_bound": not gpu,
                   "method": ("torch.cuda.max_memory_allocated over the timed steps" if gpu else
                              "estimate: model states + buffers + activations saved for backward (a lower "
                              "bound: the CPU has no allocator peak counter)"),
                   "tensor_bytes": mem},
        "nvml": nv.summary(),
        "final_loss": float(loss),
        "elapsed_s": time.perf_counter() - t_start,
    }


def measure_fusion(wl: Workload, device=None, quick: bool = False) -> dict:
    """Eager vs ``torch.compile`` of the workload's forward + backward on one fixed batch."""
    import torch

    from preflight.bench import fusion as F

    dev = torch.device(device) if device is not None else default_device()
    repeats, prof_steps = (6, 2) if quick else (15, 3)
    model = wl.model.to(dev).train()
    inputs, targets = wl.batch()
    x, y = to_device(inputs, dev), to_device(targets, dev)

    def fwd_bwd(module):
        def step():
            model.zero_grad(set_to_none=True)
            wl.step_loss(x, y, module).backward()
        return step

    fns = {"eager": fwd_bwd(model)}
    eager_prof = F.profile_categories(fns["eager"], dev, prof_steps)
    reason, compile_s, compiled_prof = F.compile_unavailable_reason(dev), None, None
    if reason is None:
        try:
            torch._dynamo.reset()
            compiled = torch.compile(model)
            t0 = time.perf_counter()
            fwd_bwd(compiled)()                          # trace, generate and build the kernels
            synchronize(dev)
            compile_s = time.perf_counter() - t0
            fns["compiled"] = fwd_bwd(compiled)
            compiled_prof = F.profile_categories(fns["compiled"], dev, prof_steps)
        except Exception as exc:  # noqa: BLE001 - any compiler failure on the user's model is a reported reason
            reason, compiled_prof = "torch.compile failed: " + F._first_line(exc), None
            fns.pop("compiled", None)
    model.zero_grad(set_to_none=True)
    timings = {k: t.as_dict() for k, t in F.interleaved_timings(fns, dev, repeats).items()}
    eager = timings["eager"]["median_s"]
    comp = timings["compiled"]["median_s"] if "compiled" in timings else None
    return {"workload": wl.describe(), "available": reason is None, "reason": reason, "device": str(dev),
            "eager_fwd_bwd_s": eager, "compiled_fwd_bwd_s": comp, "speedup_fwd_bwd": eager / comp if comp else None,
            "compile_s": compile_s, "memory_bound_share_eager": eager_prof["memory_bound_share"],
            "memory_bound_share_compiled": compiled_prof["memory_bound_share"] if compiled_prof else None,
            "categories": {"eager": eager_prof["seconds"], "compiled": compiled_prof["seconds"] if compiled_prof else None},
            "timings": timings, "samples_per_step": samples_in(x)}


def flops_table(results: dict):
    """FLOPs and MFU of the workload's step, for the chapter's table."""
    import pandas as pd

    f, m = results["flops"], results["mfu"]
    rows = [("FLOPs per step, counted (FlopCounterMode)", f"{f['counted_per_step']:.4g}"),
            ("FLOPs per sample, counted", f"{f['per_sample']:.4g}")]
    if f["formula_per_sample"]:
        rows += [("FLOPs per sample, 6N + 12Lhs", f"{f['formula_per_sample']:.4g}"),
                 ("counted / formula", f"{f['ratio_counted_to_formula']:.3f}")]
    rows += [("achieved TFLOP/s (counted FLOPs)", f"{m['achieved_tflops']:.4g}"),
             (f"MFU vs datasheet ({m.get('peak_dtype', 'fp32')})",
              f"{m['mfu_datasheet']:.1%}" if m["mfu_datasheet"] is not None else m["peak_note"]),
             ("MFU vs measured fp32 matmul ceiling", f"{m['mfu_measured_ceiling']:.1%}")]
    return pd.DataFrame(rows, columns=["quantity", "value"])
