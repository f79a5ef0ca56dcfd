"""Live check of the memory planner (preflight.bench.memory, on the GPT of preflight.harness.gptref)
against what torch really holds.

Attention paths (flash and math, GPT- and Llama-style layers): within 1 % per layer, and in fact the
same LayerNorm statistics only (test_flash_and_math_paths_match_the_planner_per_layer).

Tolerances. Model states: exact (error 0), the planner and the model count the same parameters
with the same bytes per parameter. Activations per layer: 0.5 %. The only systematic difference
is LayerNorm's mean and rstd, 8 / (34 h + 5 a s) of a layer on the CPU (16 / ... on CUDA, fp32
statistics): +0.042 % measured at the quick size; 0.5 % leaves a 10x margin and still fails on
anything real (a 2-byte dropout mask would be +1.4 %, an extra sbh copy +2.7 %, a lost dropout mask
-1.4 %). Full recompute: exactly 2 sbh per layer. Embedding + output: 1 % (token ids and targets,
int64, are not in the formula: +0.38 %).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from preflight.bench import memory as mb
from preflight.core.records import load_records
from preflight.harness import gptref
from preflight.models import memory as mm

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
LAYER_TOL = 0.005


@pytest.fixture(scope="module")
def quick():
    return mb.measure_memory("cpu", quick=True)


def test_result_is_plain_json(quick):
    back = json.loads(json.dumps(quick))
    assert back["config"]["device"] == "cpu" and back["config"]["activations_dtype"] == "bfloat16"
    for key in ("config", "states", "activations", "peak", "max_abs_error"):
        assert key in back


def test_model_states_match_exactly(quick):
    rows = {r["term"]: r for r in quick["states"]}
    assert set(rows) == {"weights", "gradients", "optimizer"}
    n = quick["config"]["params"]
    assert rows["weights"]["measured_bytes"] == 4 * n and rows["optimizer"]["measured_bytes"] == 8 * n
    for r in rows.values():
        assert r["error"] == 0 and r["measured_bytes"] == r["predicted_bytes"]
    det = quick["states_detail"]
    # the one thing left out: AdamW's 0-d fp32 step counters, one per parameter tensor
    assert det["optimizer_state_keys"] == ["exp_avg", "exp_avg_sq", "step"]
    n_tensors = len(list(gptref.make_model(gptref.CPU_QUICK, "cpu").parameters()))
    assert det["optimizer_step_counters_bytes"] == 4 * n_tensors


def test_per_layer_activations_match_formula(quick):
    a, cfg = quick["activations"], gptref.CPU_QUICK
    s, b, h, heads = cfg.seq_len, cfg.batch, cfg.hidden, cfg.heads
    assert a["per_layer_predicted"] == s * b * h * (34 + 5 * heads * s / h)
    assert len(a["per_layer_measured"]) == cfg.layers
    assert all(abs(e) <= LAYER_TOL for e in a["errors"]) and abs(a["error"]) <= LAYER_TOL
    # the difference is exactly the LayerNorm statistics: 2 norms x (mean, rstd) x sb, bf16 on the CPU
    for m in a["per_layer_measured"]:
        assert m - a["per_layer_predicted"] == 4 * s * b * 2
    assert quick["max_abs_error"] == max(abs(e) for e in a["errors"] + [e for r in quick["paths"].values()
                                                                        for e in r["errors"]])


PATH_TOL = 0.01      # the bar for the flash and math paths; measured: under 0.1 %


def test_flash_and_math_paths_match_the_planner_per_layer(quick):
    """Saved-tensor bytes per layer vs the planner for both attention paths, GPT- and Llama-style."""
    paths, cfg = quick["paths"], gptref.CPU_QUICK
    assert set(paths) == {"gpt_math", "gpt_flash", "llama_flash", "llama_math"}
    s, b, h, a = cfg.seq_len, cfg.batch, cfg.hidden, cfg.heads
    for name, r in paths.items():
        c = r["config"]
        assert r["per_layer_predicted"] == mm.layer_activation_bytes(
            s, b, h, a, attention=c["attention"], mlp=c["mlp"], ffn_hidden=c["ffn"], kv_heads=c["kv_heads"],
            dropout=c["dropout"]), name
        assert len(r["per_layer_measured"]) == cfg.layers
        assert all(abs(e) <= PATH_TOL for e in r["errors"]), (name, r["errors"])
        # and the whole difference is LayerNorm's mean and rstd (2 norms x 2 x sb, bf16)
        assert all(m - r["per_layer_predicted"] == 4 * s * b * 2 for m in r["per_layer_measured"]), name
    # flash keeps no s^2 scores: 34 sbh + the fp32 logsumexp; the math path keeps them (5 a s^2 b)
    assert paths["gpt_flash"]["per_layer_predicted"] == 34 * s * b * h + 4 * a * s * b
    assert paths["gpt_math"]["per_layer_predicted"] - paths["gpt_flash"]["per_layer_predicted"] == (
        5 * a * s * s * b - 4 * a * s * b)
    llama = paths["llama_flash"]["config"]
    assert llama["mlp"] == "swiglu" and llama["kv_heads"] == a // 4 and llama["dropout"] == 0
    assert quick["max_abs_error"] >= max(abs(e) for r in paths.values() for e in r["errors"])


def test_breakdown_is_the_papers_list(quick):
    br, cfg = quick["activations"]["breakdown"], gptref.CPU_QUICK
    s, b, h, heads = cfg.seq_len, cfg.batch, cfg.hidden, cfg.heads
    assert sum(t["bytes"] for t in br) == quick["activations"]["per_layer_measured"][0]
    ops = [op.split(".")[0] for t in br for op in t["ops"]]
    assert ops.count("NativeDropoutBackward0") == 3           # attention probs, two residual branches
    assert ops.count("SoftmaxBackward0") == 1 and ops.count("GeluBackward0") == 1
    masks = [t for t in br if t["dtype"] == "bool"]
    assert sorted(t["bytes"] for t in masks) == sorted([s * b * h, s * b * h, heads * s * s * b])
    scores = [t for t in br if t["units"].endswith("as^2b")]
    assert sum(t["bytes"] for t in scores) == 5 * heads * s * s * b
    others = sum(t["bytes"] for t in br if t not in scores and t["units"].endswith("sbh"))
    assert others == 34 * s * b * h
    assert all(t["bytes"] == 2 * s * b for t in br if t["units"].endswith(" sb"))


def test_embedding_and_output(quick):
    o, cfg = quick["activations"]["other_measured"], gptref.CPU_QUICK
    s, b, h, v = cfg.seq_len, cfg.batch, cfg.hidden, cfg.vocab
    assert o["predicted"] == s * b * h + 4 * s * b * h + 4 * s * b * v
    assert 0 <= o["error"] <= 0.01
    # what the formula leaves out: int64 token ids and targets, final-norm stats, total_weight
    assert o["total"] - o["predicted"] == 8 * s * b * 2 + 4 * s * b + 4


def test_recompute_checks(quick):
    rc, cfg = quick["recompute"], gptref.CPU_QUICK
    sbh = cfg.seq_len * cfg.batch * cfg.hidden
    full = rc["full"]
    assert full["per_layer_predicted"] == 2 * sbh and full["per_layer_measured"] == [2 * sbh] * cfg.layers
    assert full["error"] == 0
    sel = rc["selective"]
    assert sel["per_layer_predicted"] == mm.layer_activation_bytes(cfg.seq_len, cfg.batch, cfg.hidden,
                                                                   cfg.heads, recompute="selective")
    assert sel["per_layer_predicted"] == 34 * sbh and abs(sel["error"]) <= LAYER_TOL
    assert not any(t["units"].endswith("as^2b") for t in sel["breakdown"])


def test_cpu_peak_not_measured(quick):
    assert quick["peak"]["measured"] is False
    assert quick["peak"]["note"] == "not measured: no CUDA device" and quick["peak_error"] is None


def test_cpu_f_dropout_would_keep_a_dtype_sized_mask():
    """Why the model calls torch.native_dropout: on the CPU F.dropout saves a bf16 noise tensor."""
    x = torch.randn(64, 64, dtype=torch.bfloat16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        torch.nn.functional.dropout(x, 0.1, True)
        gptref.dropout(x, 0.1, True)
    assert [t.dtype for t in saved] == [torch.bfloat16, torch.bool]


def test_cli_writes_a_record(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "preflight.bench.memory", "--out", str(tmp_path), "--quick",
                           "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    [rec] = load_records(tmp_path, "memory")
    assert rec["method_version"] == mb.METHOD.version and rec["params"]["quick"] is True
    assert rec["results"]["max_abs_error"] <= LAYER_TOL
    assert "not measured: no CUDA device" in proc.stdout


@pytest.mark.gpu
@gpu
def test_gpu_peak_quick():
    r = mb.measure_memory("cuda:0", quick=True, recompute_checks=False)
    assert all(row["error"] == 0 for row in r["states"])
    assert abs(r["activations"]["error"]) <= LAYER_TOL     # fp32 LayerNorm statistics: ~0.1 %
    pk = r["peak"]
    assert pk["measured"] and pk["device"] == "cuda:0"
    assert pk["resident_before_step_bytes"] >= pk["predicted_states_bytes"]
    assert pk["measured_peak_bytes"] >= pk["resident_before_step_bytes"]
    assert -0.05 <= pk["error"] <= 1.0 and pk["within_allowance"]


def test_saved_tensors_counts_each_storage_once_and_leaves_model_state_out():
    """Two views of one buffer saved by two ops: one storage, its full size; the weight a matmul
    saves is model state and not counted; a bf16 copy of it (what autocast saves) is counted."""
    from preflight.harness.savedtensors import SavedTensors, saver_ops

    lin = torch.nn.Linear(8, 8, bias=False)
    x = torch.randn(4, 16, requires_grad=True)
    with SavedTensors(exclude=lin) as saved:
        a, b = x[:, :8], x[:, 8:]            # two views of x's storage (4 x 16 fp32 = 256 bytes)
        y = lin(a) * b                        # mm saves a (and the weight); mul saves both inputs
        w16 = lin.weight.to(torch.bfloat16)   # a new storage, like autocast's cast
        z = (y.to(torch.bfloat16) @ w16).sum()
    assert x.untyped_storage().data_ptr() in saved.storages
    assert saved.storages[x.untyped_storage().data_ptr()]["bytes"] == 4 * 16 * 4
    assert lin.weight.untyped_storage().data_ptr() not in saved.storages
    assert w16.untyped_storage().data_ptr() in saved.storages
    assert saved.total_bytes == sum(r["bytes"] for r in saved.storages.values())
    ops = saver_ops(z)
    assert any(name.startswith("MmBackward0") for name in ops[x.untyped_storage().data_ptr()])
