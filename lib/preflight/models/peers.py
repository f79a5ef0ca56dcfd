"""Our planner against a peer calculator, difference by difference: llm-analysis (PyPI
``llm-analysis`` 0.2.2, github.com/cli99/llm-analysis, ``LLMAnalysis.training`` with its defaults).

``llm_analysis_differences(plan)`` lists, per term, each convention in which llm-analysis differs
from this planner and the bytes it adds or removes, so that ``ours(plan)[term] + sum(bytes)`` is
exactly llm-analysis's number (tests/test_memory_peers.py checks it against their numbers stored in
tests/data/llm_analysis_memory.json; docs/memory-vs-llm-analysis.md explains each). llm-analysis is
not imported here or in the tests: ``tools/llm_analysis_compare.py`` runs it.

Their conventions (``analysis.py``), for a plan without recompute:

- model states: 2-byte weights, 4-byte gradients (``master_weights_dtype_bytes``), 12 bytes of Adam
  state (fp32 master copy, m, v): 18 B per parameter, ZeRO stages like DeepSpeed's, whatever the
  framework; parameters from the shape with 2 MLP matrices even when gated (SwiGLU), 2 h of norm
  weights per layer plus h, one V h embedding (tied); no gathered-layer term at ZeRO-3;
- activations, per layer: norm inputs in fp32 (``layernorm_dtype_bytes=4``); q, k, v and the
  attention output at full size (GQA not applied); with flash, ``(2 sbh + 4 a s b)`` 16-bit values
  more; the attention-output dropout mask always (``attn_dropout`` is not exposed by ``training``),
  no MLP dropout mask (``with_dropout`` neither); the MLP as GELU's 2 tensors of s b ffn; math
  attention's scores as 2 tensors of a s^2 b plus the softmax-dropout mask; ``num_layers`` layers
  (the first stage's L layers of 1F1B), plus 16-bit logits and an fp32 final-norm input, which
  ``training`` adds a second time when the micro-batch is 1 (version 0.2.2).
"""
from __future__ import annotations

from . import activations as A
from . import memory as M
from . import states as S

THEIR_STATE_BYTES = {"weights": 2, "gradients": 4, "optimizer": 12}
THEIR_NORM_BYTES = 4              # layernorm_dtype_bytes
TERMS = ("weights", "gradients", "optimizer", "activations")


def ours(plan: M.Plan) -> dict:
    """This planner's weights, gradients, optimizer, activations (layers + input/output) and gathered
    parameters, bytes on the most loaded GPU."""
    t = M.terms(plan).set_index("term")["bytes"]
    return {"weights": float(t["weights"]), "gradients": float(t["gradients"]), "optimizer": float(t["optimizer"]),
            "activations": float(t["activations"] + t["activations_output"]),
            "gathered_params": float(t.get("gathered_params", 0.0))}


def _states(p: M.Plan, mine: dict) -> dict:
    """Bytes per parameter first (at our parameter count), then their parameter count (at their bytes)."""
    lps = p.layers // p.pp
    ours_layer = S.layer_params(p.hidden, p.heads, p.kv, p.ffn, p.mlp)
    vh = p.vocab * p.hidden
    emb = vh * (1 if p.tied_embeddings else 2)
    extra = 2 if (p.pp == 1 and not p.tied_embeddings) else 1
    count = [("model.params vs the layer shapes", (lps * ours_layer - (p.params - emb) / p.pp) / p.tp)]
    if p.mlp == "swiglu":
        count.append(("SwiGLU's third matrix not counted (2 h ffn per layer)", -lps * p.hidden * p.ffn / p.tp))
    count.append(("norm weights counted (2 h per layer + h)", (lps * 2 * p.hidden + p.hidden) / p.tp))
    if extra == 2:
        count.append(("output head not counted (tied embedding assumed)", -vh / p.tp))
    out = {}
    for term, theirs_b in THEIR_STATE_BYTES.items():
        ours_b = S.LAYOUT[p.framework, p.precision][("weights", "gradients", "optimizer").index(term)]
        stage = S.SHARDED_FROM[term]
        ours_div = p.shard if p.zero_stage >= stage else 1
        theirs_div = p.dp if p.zero_stage >= stage else 1
        rows = []
        if ours_b != theirs_b:
            rows.append((f"{theirs_b} B per parameter instead of {ours_b} B", mine[term] * (theirs_b / ours_b - 1)))
        if ours_div != theirs_div:
            rows.append((f"sharded over dp = {theirs_div} (no HSDP)", mine[term] * theirs_b / ours_b
                         * (ours_div / theirs_div - 1)))
        rows += [(why, theirs_b * n / theirs_div) for why, n in count if n]
        out[term] = rows
    return out


def _activations(p: M.Plan, mine: dict) -> list[tuple[str, float]]:
    """Per layer x all L layers (1F1B's first stage, or pp = 1), then the input/output layers."""
    e = A.ELEMENT_BYTES[p.precision]
    s, b, h, a, t = p.seq_len, p.micro_batch_size, p.hidden, p.heads, p.tp
    sbh, sp = s * b * h, (t if p.sequence_parallel else 1)
    d, r = (1 if p.dropout > 0 else 0), p.kv / p.heads
    layer = [("norm inputs in fp32", 2 * (THEIR_NORM_BYTES - e) * sbh / sp),
             ("attention-output dropout mask counted without dropout", (1 - d) * sbh / sp),
             ("no MLP dropout mask", -d * sbh / sp)]
    if p.attention == "flash":
        layer += [("K, V at full size (GQA not applied to activations)", e * sbh * (2 - 2 * r) / t),
                  ("flash kernel: 2 more sbh tensors", 2 * e * sbh / t),
                  ("softmax statistics as 4 a s b 16-bit values, not a s b fp32", 4 * a * s * b * (e - 1) / t)]
    else:
        theirs_s2 = 2 * e + (1 if d else 0)        # softmax_dropout follows the plan's dropout
        layer.append(("scores as 2 tensors (+ mask)", (theirs_s2 - (e + d * (e + 1))) * a * s * s * b / t))
    layer.append(("MLP as GELU's 2 tensors of s b ffn", (2 - M.mlp_tensors(p)) * e * s * b * p.ffn / t))
    rows = [(f"per layer: {why} (x {p.layers} layers)", p.layers * x) for why, x in layer if x]
    out_ours = mine["activations"] - M.terms(p).set_index("term").loc["activations", "bytes"]
    rows.append(("our input/output-layer terms not counted", -out_ours))
    theirs_out = e * p.vocab * s * b / t + THEIR_NORM_BYTES * sbh / sp
    rows.append(("their 16-bit logits V s b / t and fp32 final-norm input", theirs_out))
    if b == 1:   # training() adds them again to the batch-size-1 total, which already holds them
        rows.append(("logits and final-norm input counted twice at micro-batch 1 (llm-analysis 0.2.2)", theirs_out))
    return rows


def llm_analysis_differences(plan: M.Plan) -> dict[str, list[tuple[str, float]]]:
    """{term: [(why, bytes llm-analysis adds to ours), ...]} for weights, gradients, optimizer and
    activations. For plans without recompute, all layers of a stage at once (1F1B with m >= pp, or pp = 1)."""
    if plan.recompute != "none":
        raise ValueError("the comparison covers recompute='none' only")
    mine = ours(plan)
    return {**_states(plan, mine), "activations": _activations(plan, mine)}
