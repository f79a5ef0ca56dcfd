"""The single-device baseline: the price list every scaling decision is checked against.

Before scaling out, train the reference model (``preflight.harness.reference``) on one device and
measure the three baselines, on the three layers at once (any one alone misleads):

- business: throughput, samples/s and tokens/s, from the median step time;
- framework: the composition of a step (data wait / forward / backward / optimizer / other, from
  ``StepTimer``) and a ``torch.profiler`` op table grouped into categories (matmul, attention,
  memory-bound, communication, data, optimizer, other). The *memory-bound share* is the headline:
  more devices do not make a memory-bound step faster, fusion does;
- hardware: NVML utilisation, clock and power on NVIDIA GPUs (``preflight.harness.nvml``);
- and peak memory, the FLOPs of one step (counted by ``FlopCounterMode`` and by the ``6N + 12 L h s``
  formula, with their ratio) and MFU against the datasheet peak and against the measured matmul
  ceiling (``preflight.bench.ceilings``), the better denominator.

The loop is a real one: a ``torch.utils.data.DataLoader`` over a synthetic dataset (so waiting for
data is real work), AdamW, warm-up steps discarded. Run alone::

    python -m preflight.bench.baseline --out results/ [--quick]
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from preflight.bench.ceilings import matmul_rate
from preflight.core import hardware
from preflight.core.device import default_device, device_name, launch_rank, on_device, torch_fp32_precision
from preflight.core.records import Method
from preflight.core.timing import StepTimer, synchronize
from preflight.harness.categories import category_table, op_table, profiler_log_filtered
from preflight.harness.nvml import NvmlSampler
from preflight.harness.savedtensors import SavedTensors
from preflight.models.flops import mfu, train_flops_per_token

if TYPE_CHECKING:       # torch and the model are imported in the functions that measure: a plan-only audit never loads it
    from torch.utils.data import DataLoader

    from preflight.harness import reference as ref

METHOD = Method("baseline", 1, required=("composition", "categories", "flops", "mfu", "memory", "throughput"))

# ------------------------------------------------------------------------------------------- data
def make_loader(cfg: ref.RefConfig, device, num_workers: int | None = None) -> DataLoader:
    """GPU: 2 worker processes and pinned batches (asynchronous copies). CPU: loading in the main
    process, since extra workers would only steal the cores the model computes on."""
    import torch
    from torch.utils.data import DataLoader

    from preflight.harness import reference as ref

    gpu = torch.device(device).type == "cuda"
    workers = (2 if gpu else 0) if num_workers is None else num_workers
    return DataLoader(ref.SyntheticTokens(cfg), batch_size=cfg.batch, num_workers=workers, pin_memory=gpu)


# ---------------------------------------------------------------------------------------- FLOPs
def _attn_flops(q, k, v, *args, out_shape=None, **kwargs) -> int:
    """QK^T and AV: 2 matmuls of 2 b h s_q s_k d FLOPs (full, not causal-halved: as torch counts)."""
    b, h, sq, d = q
    return 2 * b * h * sq * k[2] * d + 2 * b * h * sq * k[2] * v[3]


def _attn_backward_flops(grad_out, q, k, v, *args, out_shape=None, **kwargs) -> int:
    """torch's convention for fused attention backward: recompute QK^T, then dP, dV, dQ, dK."""
    b, h, sq, d = q
    return 2 * b * h * sq * k[2] * (3 * d + 2 * v[3])


def _cpu_attention_mapping() -> dict:
    """FlopCounterMode has formulas for the CUDA fused attention kernels but (torch 2.11-2.13) not
    for the CPU one, which it would count as 0 FLOPs; add it with the same convention."""
    import torch

    aten, out = torch.ops.aten, {}
    for op, fn in (("_scaled_dot_product_flash_attention_for_cpu", _attn_flops),
                   ("_scaled_dot_product_flash_attention_for_cpu_backward", _attn_backward_flops)):
        if hasattr(aten, op):
            out[getattr(aten, op)] = fn
    return out


def count_flops(model, cfg: ref.RefConfig, x, y, device) -> dict:
    """FLOPs of one forward + backward, counted by ``FlopCounterMode`` and by ``6N + 12 L h s``."""
    from torch.utils.flop_counter import FlopCounterMode

    from preflight.harness import reference as ref

    with FlopCounterMode(display=False, custom_mapping=_cpu_attention_mapping()) as fc:
        with ref.autocast(cfg, device):
            loss = model(x, y)
        loss.backward()
    model.zero_grad(set_to_none=True)
    n = ref.count_params(model, exclude_embeddings=True)
    tokens = cfg.batch * cfg.seq_len
    formula = train_flops_per_token(n, cfg.layers, cfg.hidden, cfg.seq_len) * tokens
    counted = float(fc.get_total_flops())
    return {"counted_per_step": counted, "formula_per_step": formula, "ratio_counted_to_formula":
            counted / formula, "counted_by_op": {str(k): int(v) for k, v in fc.get_flop_counts()["Global"].items()},
            "params_no_embeddings": n, "tokens_per_step": tokens,
            "formula": "6N + 12*L*h*s per token, N without embeddings; attention counted full (not causal-halved)"}


# --------------------------------------------------------------------------------------- memory
def tensor_bytes(model, opt, cfg: ref.RefConfig, x, y, device) -> dict:
    """Bytes held by the training state and by the activations autograd saves for backward.

    Activations: every tensor the forward saves (``preflight.harness.savedtensors``), counted once per
    storage, parameters and buffers excluded (under bf16 autocast the bf16 copies of the weights are saved
    tensors too, and are counted). This is a lower bound of the peak: transient buffers, gradients
    of activations in flight and allocator overhead are not in it."""
    import torch

    from preflight.harness import reference as ref

    with SavedTensors(exclude=model) as saved:
        with ref.autocast(cfg, device):
            loss = model(x, y)
    del loss
    p_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    g_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    o_bytes = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                  if torch.is_tensor(t))
    return {"parameters": p_bytes, "gradients": g_bytes, "optimizer_state": o_bytes,
            "saved_activations": saved.total_bytes}


# -------------------------------------------------------------------------------------- the loop
def _step(model, opt, batches, cfg, dev, timer: StepTimer):
    import torch

    from preflight.harness import reference as ref

    rf = torch.profiler.record_function
    with timer.phase("data_wait"), rf("data_wait"):
        x, y = next(batches)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
    with timer.phase("forward"), rf("forward"), ref.autocast(cfg, dev):
        loss = model(x, y)
    with timer.phase("backward"), rf("backward"):
        loss.backward()
    with timer.phase("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)
    timer.end_step()
    return loss.detach()


def measure_baseline(device=None, cfg: ref.RefConfig | None = None, steps: int | None = None,
                     quick: bool = False, warmup: int | None = None, profile_steps: int | None = None,
                     num_workers: int | None = None) -> dict:
    """Train the reference model on one device and return the baselines as a JSON-able dict.

    Keys: device, device_name, quick, config, params, params_no_embeddings; headline scalars
    step_time_s, samples_per_s, tokens_per_s, memory_bound_share, mfu_datasheet,
    mfu_measured_ceiling, peak_memory_GB; then throughput, composition (list of {phase, seconds,
    share}), categories (list of {category, time_s, share}), top_ops, profile, flops, mfu, memory,
    nvml, final_loss, elapsed_s.
    ``quick`` uses the tiny config (``reference.CPU_TINY``) and few steps: a smoke test.
    """
    import torch

    from preflight.harness import reference as ref

    t_start = time.perf_counter()
    dev = torch.device(device) if device is not None else default_device()
    gpu = dev.type == "cuda"
    cfg = cfg or ref.config_for(dev, tiny=quick)
    warmup = warmup if warmup is not None else (1 if quick else (5 if gpu else 2))
    steps = steps or (4 if quick else (20 if gpu else 12))
    profile_steps = profile_steps or (2 if quick else 3)

    with on_device(dev):
        model = ref.make_model(cfg, dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        loader = make_loader(cfg, dev, num_workers)
        batches = iter(loader)
        timer = StepTimer(dev)
        for _ in range(warmup):
            _step(model, opt, batches, cfg, dev, timer)
        if gpu:
            torch.cuda.reset_peak_memory_stats(dev)
        with NvmlSampler(dev) as nv:
            for _ in range(steps):
                loss = _step(model, opt, batches, cfg, dev, timer)
        peak_alloc = torch.cuda.max_memory_allocated(dev) if gpu else None
        peak_reserved = torch.cuda.max_memory_reserved(dev) if gpu else None
        free_running_s = None
        if gpu:   # the timer drains the GPU at each phase boundary; throughput comes from free steps
            synchronize(dev)
            t0 = time.perf_counter()
            for _ in range(steps):
                _step(model, opt, batches, cfg, dev, StepTimer(dev, sync=False))
            synchronize(dev)
            free_running_s = (time.perf_counter() - t0) / steps

        prof_info, ops = _profile(model, opt, batches, cfg, dev, profile_steps)
        x, y = (t.to(dev) for t in next(batches))
        flops = count_flops(model, cfg, x, y, dev)
        tb = tensor_bytes(model, opt, cfg, x, y, dev)
        ceiling = matmul_rate(dev, dtype=cfg.dtype, n=(4096 if gpu else 512) if quick else None)
        del batches

    frame = timer.frame(skip=warmup)
    synced_s = float(frame["total"].median())
    step_s = free_running_s or synced_s     # CPU: synchronising is a no-op, the two are the same
    tokens = cfg.batch * cfg.seq_len
    cats = category_table(ops) if ops is not None else None
    name = device_name(dev) if gpu else None
    precision = torch_fp32_precision(model) if cfg.dtype == "fp32" else None
    peak_dtype = precision["peak_dtype"] if precision else cfg.dtype      # TF32 allowed: the TF32 peak
    peak = hardware.peak_tflops(name, peak_dtype)
    achieved = flops["formula_per_step"] / step_s
    est = sum(tb.values())
    mb_share = float(cats.set_index("category").loc["memory_bound", "share"]) if cats is not None else None
    peak_GB = (peak_alloc if gpu else est) / 1e9
    return {
        "device": str(dev), "device_name": name, "quick": quick, "config": cfg.as_dict(),
        "params": ref.count_params(model), "params_no_embeddings": flops["params_no_embeddings"],
        # headline scalars (what records_frame shows); the details follow
        "step_time_s": step_s, "samples_per_s": cfg.batch / step_s, "tokens_per_s": tokens / step_s,
        "memory_bound_share": mb_share, "mfu_datasheet": mfu(achieved, peak),
        "mfu_measured_ceiling": mfu(achieved, ceiling["tflops"]), "peak_memory_GB": peak_GB,
        "throughput": {"warmup_steps": warmup, "steps": steps, "tokens_per_step": tokens,
                       "step_time_s": step_s, "step_time_synced_median_s": synced_s,
                       "step_time_basis": ("mean of free-running steps (one synchronisation at the end)" if gpu
                                           else "median step of the phase timer"),
                       "step_time_p10_s": float(frame["total"].quantile(0.1)),
                       "step_time_p90_s": float(frame["total"].quantile(0.9)),
                       "samples_per_s": cfg.batch / step_s, "tokens_per_s": tokens / step_s},
        "composition": timer.composition(skip=warmup).to_dict("records"),
        "categories": cats.to_dict("records") if cats is not None else None,
        "top_ops": ops.head(15).to_dict("records") if ops is not None else None,
        "profile": prof_info,
        "flops": flops,
        "mfu": {"achieved_tflops": achieved / 1e12,
                "flops_basis": "formula_per_step / step time (" + ("mean of free-running steps" if gpu else "median step") + ")",
                "dtype": cfg.dtype, "precision": precision, "peak_dtype": peak_dtype,
                "datasheet_peak_tflops": peak, "mfu_datasheet": mfu(achieved, peak),
                "peak_note": (f"{hardware.lookup(name).source}, dense {peak_dtype}" if peak else
                              f"unknown peak: {name or 'the CPU'} has no {peak_dtype} entry in preflight.core.hardware"),
                "measured_ceiling_tflops": ceiling["tflops"], "mfu_measured_ceiling": mfu(achieved, ceiling["tflops"]),
                "ceiling": ceiling},
        "memory": {
            "method": ("torch.cuda.max_memory_allocated over the timed steps (caching-allocator peak)" if gpu else
                       "estimate: bytes of parameters + gradients + optimizer state + activations saved for "
                       "backward (saved_tensors_hooks, unique storages); a lower bound, the CPU has no "
                       "allocator peak counter"),
            "peak_GB": peak_GB, "is_lower_bound": not gpu,
            "reserved_peak_GB": peak_reserved / 1e9 if gpu else None,
            "tensor_bytes": tb, "tensor_bytes_GB": est / 1e9},
        "nvml": nv.summary(),
        "final_loss": float(loss),
        "elapsed_s": time.perf_counter() - t_start,
    }


def _profile(model, opt, batches, cfg, dev, n: int):
    """``n`` training steps under ``torch.profiler``; returns (info dict, op table or None)."""
    from torch.profiler import ProfilerActivity, profile

    gpu = dev.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    try:
        synchronize(dev)
        t0 = time.perf_counter()
        with profiler_log_filtered(), profile(activities=acts, acc_events=True) as prof:   # one cycle; no warning
            for _ in range(n):
                _step(model, opt, batches, cfg, dev, StepTimer(dev))
            synchronize(dev)
        wall = time.perf_counter() - t0
        ops = op_table(prof, dev)
    except RuntimeError as err:        # e.g. CUPTI missing: keep the rest of the baseline
        return {"available": False, "reason": f"torch.profiler failed: {err}"}, None
    if not len(ops):                   # CUPTI refused (e.g. a sandboxed GPU): kineto only logs it
        return {"available": False, "reason": "torch.profiler recorded no op time" + (
            " (no CUDA kernel events: CUPTI unavailable here?)" if gpu else "")}, None
    busy = float(ops["time_s"].sum())
    return {"available": True, "steps": n, "wall_s": wall, "op_time_s": busy, "coverage": busy / wall,
            "time_basis": ("self device (kernel) time; 1 - coverage ~ device idle" if gpu else
                           "self CPU time; 1 - coverage ~ Python and profiler overhead")}, ops


# -------------------------------------------------------------------------- notebook DataFrames
def composition_frame(result: dict):
    import pandas as pd

    return pd.DataFrame(result["composition"])


def categories_frame(result: dict):
    import pandas as pd

    return pd.DataFrame(result["categories"] or [], columns=["category", "time_s", "share"])


def ops_frame(result: dict):
    import pandas as pd

    return pd.DataFrame(result["top_ops"] or [], columns=["op", "category", "time_s"])


# ------------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    import torch

    from preflight.core.records import save_record

    ap = argparse.ArgumentParser(prog="python -m preflight.bench.baseline", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="results folder")
    ap.add_argument("--quick", action="store_true", help="tiny model, few steps: a smoke test")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (after warm-up)")
    ap.add_argument("--device", default=None, help="e.g. cpu or cuda:1 (default: this rank's GPU, else CPU)")
    args = ap.parse_args(argv)

    dev = torch.device(args.device) if args.device else default_device()
    res = measure_baseline(dev, steps=args.steps, quick=args.quick)
    rank = launch_rank()
    params = {"quick": args.quick, "steps": res["throughput"]["steps"], "device": str(dev), "rank": rank,
              "config": res["config"]}
    path = save_record(METHOD.record(params, res), args.out,
                       name=f"rank{rank}" if rank is not None else None)
    tp, m = res["throughput"], res["mfu"]
    mb = res["memory_bound_share"]
    print(f"[{path.name}] {dev}: step {tp['step_time_s'] * 1e3:.1f} ms, {tp['samples_per_s']:.1f} samples/s, "
          f"{tp['tokens_per_s']:.0f} tokens/s, memory-bound share "
          f"{'n/a' if mb is None else f'{mb:.0%}'}, MFU vs matmul ceiling {m['mfu_measured_ceiling']:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
