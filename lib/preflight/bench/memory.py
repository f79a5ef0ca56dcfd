"""The memory planner checked live: predicted bytes against bytes measured on this machine.

``preflight.models.memory`` predicts per-GPU memory from formulas alone. This module builds the GPT
those formulas describe exactly (``preflight.harness.gptref``, which explains why each part of the
layer is written as it is) and counts what it really holds, term by term:

1. **Model states** (Rajbhandari et al. 2020). The GPT in fp32, one step of ``torch.optim.AdamW``;
   the bytes of the parameters, their ``.grad`` and the optimizer state (``exp_avg``,
   ``exp_avg_sq``) against ``Plan(params=<the model's own count>, precision="fp32")``'s
   ``weights``, ``gradients`` and ``optimizer`` terms, 4 + 4 + 8 bytes per parameter: they agree to
   the byte. Left out by the planner: AdamW's ``step``, a 0-d fp32 tensor per parameter (on the CPU
   unless ``capturable``/``fused``), reported apart as ``states_detail["optimizer_step_counters_bytes"]``.

2. **Activations** (Korthikanti et al. 2022, Table 2: ``sbh (34 + 5 a s / h)`` bytes per layer).
   The GPT in bfloat16 (the CPU supports it); every tensor autograd saves during one forward pass
   is caught by ``preflight.harness.savedtensors`` (``saved_tensors_hooks``) and counted once per *storage* (a view
   saved by two ops, or a slice of a larger buffer, holds the whole storage, once), parameters and
   buffers excluded (model state, not activations). Forward hooks on the layers say which part is
   running, so bytes land per layer, embedding and output; a walk of the autograd graph afterwards
   names the op(s) that saved each storage (``NativeLayerNormBackward0._saved_input``...).

   The one systematic difference is LayerNorm's mean and rstd (``s b`` values each, four per layer:
   8 sb bytes in bf16 on the CPU, 16 in fp32 on CUDA), ``8 / (34 h + 5 a s)`` of the layer: measured
   on a 2-core Xeon, +0.042 % at the quick size, +0.021 % at the normal one, never below the formula.
   Outside the layers the planner's ``activations_output`` (pp = 1: embedding dropout mask sbh,
   final-norm and head inputs 2 + 2 sbh, fp32 logits 4 sbV) misses the int64 token ids and targets
   (8 sb bytes each), the final norm's statistics and the loss's 0-d ``total_weight``:
   ``other_measured`` is +0.38 % above it at the quick size, +0.11 % at the normal one.

   Recompute checks, against ``layer_activation_bytes(..., recompute=...)``: ``"selective"`` keeps
   34 sbh (its checkpoint's QKV input is exactly the 6 sbh of q, k, v), ``"full"`` exactly the 2 sbh
   layer input (the checkpoint also keeps the generator state to replay dropout: a small CPU tensor
   outside autograd's saved tensors). +0.09 % and 0 at the quick size. Their breakdowns carry shapes,
   not op names: reading a saved tensor inside a checkpointed region would run its recomputation.

   Attention paths and layer shapes (``paths``, ``gptref.variants``): GPT-style with math and
   with flash attention (SDPA's CPU flash kernel: q, k, v, output, fp32 logsumexp, no s^2), and
   Llama-style (SwiGLU, a quarter of the heads for K and V, no dropout) with flash and with math.
   Measured on a 2-core EPYC, per layer: +0.042 %, +0.092 %, +0.089 %, +0.058 % at the quick size
   (+0.021 / 0.046 / 0.045 / 0.029 % at the normal one), each exactly the LayerNorm statistics.

3. **Peak on CUDA.** The GPT in fp32, one warm-up step (optimizer state, cuBLAS workspaces),
   gradients kept allocated (``zero_grad(set_to_none=False)``, like Megatron's persistent gradient
   buffer), then ``torch.cuda.max_memory_allocated`` over one step, against the planner's total
   *without* the framework allowance. What is resident before the step is the states plus the batch
   and workspaces (``resident_error_vs_states``). The peak adds transients the planner does not
   model: the logits and their log-probabilities coexist in ``log_softmax`` (4 sbV each), so do
   their gradients in backward. Expect the peak above the total by ~one or two 4 sbV plus the
   workspaces, inside the 1 GiB + 10 % allowance (``within_allowance``): reasoned, not yet measured
   on a GPU when this was written, so read the record's figures. On the CPU there is no allocator
   peak counter: ``peak`` says "not measured: no CUDA device".

Errors are ``measured / predicted - 1``. ``max_abs_error`` covers the model states and the
per-layer activations (what the formulas claim to predict exactly); the peak keeps its own error.

Run alone::

    python -m preflight.bench.memory --out results/ [--quick] [--device cpu]
"""
from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from collections import defaultdict
from typing import TYPE_CHECKING

from preflight.core.device import default_device, on_device
from preflight.core.records import Method
from preflight.core.timing import synchronize
from preflight.harness.savedtensors import SavedTensors, saver_ops
from preflight.models import memory as mm

if TYPE_CHECKING:       # torch and the GPT are imported in the functions that measure: a plan-only audit never loads it
    import torch

    from preflight.harness.gptref import GPT, MemConfig

METHOD = Method("memory", 2, required=("config", "states", "activations", "paths", "peak"))


def plan_for(cfg: MemConfig, params: int, precision: str, recompute: str = "none") -> mm.Plan:
    """The planner's view of this model on one device (no parallelism, one micro-batch)."""
    return mm.Plan(params=params, layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads, vocab=cfg.vocab,
                   seq_len=cfg.seq_len, micro_batch_size=cfg.batch, precision=precision,
                   recompute=recompute, attention=cfg.attention, mlp=cfg.mlp, ffn_hidden=cfg.ffn,
                   kv_heads=cfg.kv_heads, dropout=cfg.dropout)


def _err(measured: float, predicted: float) -> float:
    return measured / predicted - 1.0


# ------------------------------------------------------------------------------------ model states
def measure_states(cfg: MemConfig, device) -> dict:
    """fp32 model, AdamW, one forward/backward/step; bytes of parameters, gradients and optimizer
    state against the planner's fp32 terms (4 + 4 + 8 bytes per parameter)."""
    import torch

    from preflight.harness.gptref import count_params, make_batch, make_model

    model = make_model(cfg, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx, tgt = make_batch(cfg, device)
    model(idx, tgt).backward()
    opt.step()
    nbytes = lambda t: t.numel() * t.element_size()          # noqa: E731
    weights = sum(nbytes(p) for p in model.parameters())
    grads = sum(nbytes(p.grad) for p in model.parameters() if p.grad is not None)
    moments = counters = 0
    state_keys = set()
    for st in opt.state.values():
        for key, t in st.items():
            if not torch.is_tensor(t):
                continue
            state_keys.add(key)
            if key == "step":
                counters += nbytes(t)
            else:
                moments += nbytes(t)
    n = count_params(model)
    df = mm.terms(plan_for(cfg, n, "fp32")).set_index("term")
    rows = [{"term": term, "predicted_bytes": float(df.loc[term, "bytes"]), "measured_bytes": int(meas),
             "error": _err(meas, float(df.loc[term, "bytes"])), "what": what}
            for term, meas, what in (("weights", weights, "fp32 parameters"),
                                     ("gradients", grads, "fp32 .grad of every parameter"),
                                     ("optimizer", moments, "AdamW exp_avg + exp_avg_sq, fp32"))]
    return {"params": n, "rows": rows, "optimizer_state_keys": sorted(state_keys),
            "optimizer_step_counters_bytes": int(counters),
            "optimizer_step_counters_note": (f"AdamW's 'step': a 0-d fp32 tensor per parameter ({len(opt.state)} "
                                             "tensors), left out by the planner and by the rows above")}


# ------------------------------------------------------------------------------------- activations
def _units(nbytes: int, shape: list[int], cfg: MemConfig) -> str:
    """Bytes in the paper's units (they are byte counts: "2 sbh" is a 16-bit s x b x h tensor):
    a s^2 b for score-shaped tensors, s b V for logits, else sbh, else s b."""
    s, b, h, a, v = cfg.seq_len, cfg.batch, cfg.hidden, cfg.heads, cfg.vocab
    numel = math.prod(shape)
    if shape[-2:] == [s, s] and numel == a * s * s * b:
        unit, name = a * s * s * b, "as^2b"
    elif numel == a * s * b and nbytes % (s * b * h):
        unit, name = a * s * b, "asb"
    elif numel == s * b * v:
        unit, name = s * b * v, "sbV"
    elif nbytes % (s * b * h) == 0:
        unit, name = s * b * h, "sbh"
    else:
        unit, name = s * b, "sb"
    return f"{nbytes / unit:g} {name}"


def saved_activations(model: GPT, idx: torch.Tensor, tgt: torch.Tensor, name_ops: bool = True) -> dict:
    """Every storage autograd saves for backward during one forward pass, once each, parameters
    and buffers excluded, attributed to the part of the model that was running when it was saved
    ("embedding", "layer0".."layer{L-1}", "output"). Returns {"tensors": [...], "by_part": {...}}.

    ``name_ops`` walks the graph to name the saving ops. Leave it off for a checkpointed model:
    reading a saved tensor inside a checkpointed region runs the region's recomputation (once per
    read, outside backward).
    """
    saved = SavedTensors(exclude=model)
    saved.part = "embedding"
    hooks = []
    for i, layer in enumerate(model.layers):
        hooks.append(layer.register_forward_pre_hook(lambda m, a, i=i: setattr(saved, "part", f"layer{i}")))
        hooks.append(layer.register_forward_hook(lambda m, a, o: setattr(saved, "part", "output")))
    try:
        with saved:
            loss = model(idx, tgt)
    finally:
        for hk in hooks:
            hk.remove()
    ops = saver_ops(loss) if name_ops else {}
    del loss
    tensors, by_part = [], defaultdict(int)
    for ptr, rec in saved.storages.items():
        rec["ops"] = sorted(ops.get(ptr, ())) or [
            "not named (checkpointed model)" if not name_ops else "not found on the graph"]
        rec["units"] = _units(rec["bytes"], rec["shape"], model.cfg)
        tensors.append(rec)
        by_part[rec["part"]] += rec["bytes"]
    return {"tensors": tensors, "by_part": dict(by_part)}


def measure_activations(cfg: MemConfig, device, recompute: str = "none") -> dict:
    """bf16 model, one forward under the hooks; per-layer bytes against ``layer_activation_bytes``,
    embedding + output bytes against the planner's ``activations_output``."""
    import torch

    from preflight.harness.gptref import count_params, make_batch, make_model

    model = make_model(cfg, device, dtype=torch.bfloat16).set_recompute(recompute)
    idx, tgt = make_batch(cfg, device)
    got = saved_activations(model, idx, tgt, name_ops=recompute == "none")
    predicted = mm.layer_activation_bytes(seq_len=cfg.seq_len, micro_batch_size=cfg.batch, hidden=cfg.hidden,
                                          heads=cfg.heads, recompute=recompute, attention=cfg.attention, mlp=cfg.mlp,
                                          ffn_hidden=cfg.ffn, kv_heads=cfg.kv_heads, dropout=cfg.dropout)
    per_layer = [got["by_part"].get(f"layer{i}", 0) for i in range(cfg.layers)]
    errors = [_err(m, predicted) for m in per_layer]
    df = mm.terms(plan_for(cfg, count_params(model), "mixed", recompute)).set_index("term")
    other_pred = float(df.loc["activations_output", "bytes"])
    other_meas = got["by_part"].get("embedding", 0) + got["by_part"].get("output", 0)
    sbh = cfg.seq_len * cfg.batch * cfg.hidden
    return {
        "recompute": recompute,
        "per_layer_predicted": predicted,
        "per_layer_measured": per_layer,
        "error": max(errors, key=abs),
        "errors": errors,
        "per_layer_predicted_sbh": predicted / sbh,
        "per_layer_measured_sbh": [m / sbh for m in per_layer],
        "breakdown": [t for t in got["tensors"] if t["part"] == "layer0"],
        "other_measured": {"embedding": got["by_part"].get("embedding", 0),
                           "output": got["by_part"].get("output", 0), "total": other_meas,
                           "predicted": other_pred, "error": _err(other_meas, other_pred),
                           "breakdown": [t for t in got["tensors"] if t["part"] in ("embedding", "output")]},
        "total_measured": sum(got["by_part"].values()),
        "total_predicted": float(df.loc["activations", "bytes"]) + other_pred,
    }


# --------------------------------------------------------------------------------------- CUDA peak
def measure_peak(cfg: MemConfig, device) -> dict:
    """``torch.cuda.max_memory_allocated`` over one fp32 training step (after a warm-up step, with
    gradients kept allocated), against the planner's fp32 total without the framework allowance."""
    import torch

    from preflight.harness.gptref import count_params, make_batch, make_model

    dev = torch.device(device)
    if dev.type != "cuda":
        return {"device": str(dev), "measured": False, "note": "not measured: no CUDA device"}
    gc.collect()                        # nothing left over from the earlier measurements
    model = make_model(cfg, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx, tgt = make_batch(cfg, dev)
    model(idx, tgt).backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    resident = torch.cuda.memory_allocated(dev)
    model(idx, tgt).backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev)
    df = mm.terms(plan_for(cfg, count_params(model), "fp32")).set_index("term")
    pred_terms = {t: float(df.loc[t, "bytes"]) for t in df.index if t != "framework"}
    predicted = sum(pred_terms.values())
    states = sum(pred_terms[t] for t in ("weights", "gradients", "optimizer"))
    del model, opt
    return {"device": str(dev), "measured": True, "precision": "fp32",
            "method": ("torch.cuda.max_memory_allocated over one forward/backward/AdamW step after a "
                       "warm-up step; gradients kept allocated (zero_grad(set_to_none=False))"),
            "measured_peak_bytes": int(peak), "predicted_bytes": predicted, "error": _err(peak, predicted),
            "resident_before_step_bytes": int(resident),
            "predicted_states_bytes": states, "resident_error_vs_states": _err(resident, states),
            "step_growth_bytes": int(peak - resident),
            "predicted_activation_bytes": pred_terms["activations"] + pred_terms["activations_output"],
            "predicted_terms": pred_terms,
            "framework_allowance_bytes": float(df.loc["framework", "bytes"]),
            "within_allowance": bool(peak <= predicted + float(df.loc["framework", "bytes"]))}


# -------------------------------------------------------------------------------------------- all
def measure_memory(device=None, quick: bool = False, cfg: MemConfig | None = None,
                   recompute_checks: bool = True) -> dict:
    """Predicted vs measured memory on one device; a JSON-able dict.

    Keys: config (dims, dtypes, device), states (list of {term, predicted_bytes, measured_bytes,
    error, what}), states_detail, activations ({per_layer_predicted, per_layer_measured (one per
    layer), error (the largest by magnitude), breakdown (layer 0's saved tensors: part, bytes, shape,
    dtype, ops, units), other_measured (embedding + output vs ``activations_output``)}), recompute
    ({selective, full}: the same per-layer check with ``torch.utils.checkpoint``), peak (CUDA only,
    else a "not measured" note), and the headline scalars max_abs_error (states + per-layer
    activations), activation_error, peak_error, elapsed_s. ``paths``: {gpt_math, gpt_flash,
    llama_flash, llama_math} (``gptref.variants``, at the quick size unless ``cfg`` is given: the
    per-layer error does not depend on the size), each {config, per_layer_predicted,
    per_layer_measured, error, errors, *_sbh}; their errors count in max_abs_error too.
    """
    import torch

    from preflight.harness.gptref import config_for, variants

    t0 = time.perf_counter()
    dev = torch.device(device) if device is not None else default_device()
    path_cfgs = variants(cfg or config_for(dev, quick=True))
    cfg = cfg or config_for(dev, quick)
    keep = ("per_layer_predicted", "per_layer_measured", "error", "errors", "per_layer_predicted_sbh",
            "per_layer_measured_sbh")
    with on_device(dev):
        states = measure_states(cfg, dev)
        acts = measure_activations(cfg, dev)
        paths = {name: {"config": c.as_dict(), **{k: v for k, v in measure_activations(c, dev).items() if k in keep}}
                 for name, c in path_cfgs.items()}
        rc = ({mode: {k: v for k, v in measure_activations(cfg, dev, mode).items() if k in (*keep, "breakdown")}
               for mode in ("selective", "full")} if recompute_checks else None)
        peak = measure_peak(cfg, dev)
    errs = [r["error"] for r in states["rows"]] + acts["errors"] + [e for r in paths.values() for e in r["errors"]]
    return {
        "device": str(dev), "quick": quick,
        "config": {**cfg.as_dict(), "device": str(dev), "params": states["params"],
                   "states_dtype": "float32 (AdamW)", "activations_dtype": "bfloat16",
                   "peak_dtype": "float32" if peak["measured"] else None,
                   "attention_impl": ("explicit softmax(q k^T / sqrt(d) + causal bias) v, dropout on the probabilities"
                                      if cfg.attention == "math" else "F.scaled_dot_product_attention (flash kernel)"),
                   "dropout_impl": "torch.native_dropout (bool masks)"},
        "states": states["rows"],
        "states_detail": {k: v for k, v in states.items() if k != "rows"},
        "activations": acts,
        "paths": paths,
        "recompute": rc,
        "peak": peak,
        "max_abs_error": max(abs(e) for e in errs),
        "activation_error": acts["error"],
        "peak_error": peak.get("error"),
        "elapsed_s": time.perf_counter() - t0,
    }


# ------------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    import torch

    from preflight.core.records import save_record

    ap = argparse.ArgumentParser(prog="python -m preflight.bench.memory", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="results folder for the record")
    ap.add_argument("--quick", action="store_true", help="small sizes (tests, smoke runs)")
    ap.add_argument("--device", default=None, help="e.g. cpu or cuda:1 (default: this rank's GPU, else CPU)")
    args = ap.parse_args(argv)

    dev = torch.device(args.device) if args.device else default_device()
    res = measure_memory(dev, quick=args.quick)
    rec = METHOD.record({"quick": args.quick, "device": str(dev), "config": res["config"]}, res)
    path = save_record(rec, args.out)
    a, pk = res["activations"], res["peak"]
    print(f"memory ({dev}): states max |error| {max(abs(r['error']) for r in res['states']):.2%}; per layer "
          f"{a['per_layer_measured'][0] / 2**20:.2f} MiB measured vs {a['per_layer_predicted'] / 2**20:.2f} MiB "
          f"predicted ({a['error']:+.2%}); peak "
          + (f"{pk['measured_peak_bytes'] / 2**30:.2f} GiB vs {pk['predicted_bytes'] / 2**30:.2f} GiB "
             f"({pk['error']:+.1%})" if pk["measured"] else pk["note"]) + f" -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
