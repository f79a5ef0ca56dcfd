"""Our memory planner beside llm-analysis (PyPI ``llm-analysis``, github.com/cli99/llm-analysis) on
the same configurations, for docs/memory-vs-llm-analysis.md.

llm-analysis is not a dependency of Preflight; install it into the venv to regenerate::

    .venv/bin/pip install llm-analysis==0.2.2
    .venv/bin/python tools/llm_analysis_compare.py            # prints the tables
    .venv/bin/python tools/llm_analysis_compare.py --write    # + tests/data/llm_analysis_memory.json

The JSON keeps the configurations and their numbers; tests/test_memory_peers.py recomputes ours and
checks that ours plus every explained difference (``preflight.models.peers``) gives theirs.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path

from preflight.models import memory as M
from preflight.models import peers
from preflight.models import states as S

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "llm_analysis_memory.json"
GiB = 2 ** 30
LLAMA70 = dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, mlp="swiglu", vocab=32000)
LLAMA3_8 = dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, mlp="swiglu", vocab=128256)
GPT3 = dict(layers=96, hidden=12288, heads=96, vocab=51200)
CONFIGS = {
    "example-7b": ("The example profile: 7B GPT-style, flash attention, deepspeed ZeRO-0 on 1024 GPUs",
                   dict(params=7e9, layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096, dp=1024)),
    "llama2-70b": ("Llama-2-70B shape (GQA 8/64, SwiGLU 28672, no dropout), Megatron tp=8 sp pp=4, "
                   "distributed optimizer, 1024 GPUs",
                   dict(params=S.model_params(**LLAMA70), **LLAMA70, seq_len=4096, tp=8, sequence_parallel=True, pp=4,
                        dp=32, microbatches=16, zero_stage=1, framework="megatron", dropout=0.0)),
    "gpt3-175b-math": ("GPT-3 175B shape, math attention with dropout, tp=8 sp pp=8, deepspeed ZeRO-1, 1024 GPUs",
                       dict(params=S.model_params(**GPT3), **GPT3, seq_len=2048, tp=8, sequence_parallel=True, pp=8,
                            dp=16, microbatches=64, zero_stage=1, attention="math")),
    "llama3-8b-fsdp2": ("Llama-3-8B shape (GQA 8/32, SwiGLU 14336, vocab 128256), FSDP2 on 64 GPUs, s = 8192",
                        dict(params=S.model_params(**LLAMA3_8), **LLAMA3_8, seq_len=8192, dp=64, zero_stage=3,
                             framework="fsdp2", dropout=0.0)),
}


def theirs(plan: M.Plan) -> dict:
    """llm-analysis's training memory per GPU for the plan (bytes)."""
    from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
    from llm_analysis.config import DtypeConfig, ModelConfig, ParallelismConfig, get_gpu_config_by_name

    logging.getLogger("llm_analysis").setLevel(logging.ERROR)
    model = ModelConfig(name="x", num_layers=plan.layers, n_head=plan.heads, hidden_dim=plan.hidden,
                        vocab_size=plan.vocab, max_seq_len=plan.seq_len, num_key_value_heads=plan.kv,
                        ffn_embed_dim=plan.ffn, expansion_ratio=plan.ffn / plan.hidden)
    par = ParallelismConfig(tp_size=plan.tp, pp_size=plan.pp, dp_size=plan.dp,
                            sp_size=plan.tp if plan.sequence_parallel else 1)
    la = LLMAnalysis(model, get_gpu_config_by_name("h100-sxm-80gb"), DtypeConfig(), par)
    r = la.training(batch_size_per_gpu=plan.micro_batch_size, gradient_accumulation_steps=plan.microbatches,
                    global_batch_size=plan.micro_batch_size * plan.microbatches * plan.dp, seq_len=plan.seq_len,
                    activation_recomputation=ActivationRecomputation[plan.recompute.upper()],
                    ds_zero=DSZeRO(plan.zero_stage), flash_attn=plan.attention == "flash",
                    softmax_dropout=plan.attention == "math" and plan.dropout > 0,
                    mlp_gated_linear_units=plan.mlp == "swiglu")
    return {"weights": r["weight_memory_per_gpu"], "gradients": r["gradient_memory_per_gpu"],
            "optimizer": r["optimizer_state_memory_per_gpu"], "activations": r["activation_memory_per_gpu"]}


def table(plan: M.Plan, their: dict) -> str:
    """A markdown table (GiB per GPU: ours, theirs, the difference) and the differences explained."""
    ours, diffs = peers.ours(plan), peers.llm_analysis_differences(plan)
    rows = ["| per GPU (GiB) | Preflight | llm-analysis | llm-analysis - Preflight |", "|---|---:|---:|---:|"]
    notes = []
    for term in peers.TERMS:
        rows.append(f"| {term} | {ours[term] / GiB:.2f} | {their[term] / GiB:.2f} | {(their[term] - ours[term]) / GiB:+.2f} |")
        explained = ours[term] + sum(b for _, b in diffs[term])
        assert abs(explained / their[term] - 1) < 1e-9, (term, explained, their[term])
        notes.append(f"- {term}: " + ("; ".join(f"{w} {b / GiB:+.2f}" for w, b in diffs[term] if abs(b) >= 0.005 * GiB)
                                      or "only differences under 0.01 GiB (norm weights)"))
    if ours["gathered_params"]:
        rows.append(f"| gathered_params | {ours['gathered_params'] / GiB:.2f} | - | {-ours['gathered_params'] / GiB:+.2f} |")
    return "\n".join(rows) + "\n\n" + "\n".join(notes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"store their numbers in {OUT}")
    args = ap.parse_args(argv)
    data = {"tool": "llm-analysis", "version": version("llm-analysis"),
            "call": "LLMAnalysis(...).training(...), gpu h100-sxm-80gb, dtype w16a16e16, defaults otherwise "
                    "(tools/llm_analysis_compare.py)", "configs": {}}
    for name, (what, kw) in CONFIGS.items():
        plan = M.Plan(**kw)
        their = theirs(plan)
        data["configs"][name] = {"what": what, "plan": asdict(plan), "theirs_bytes": their}
        print(f"\n### {name}: {what}\n\n{table(plan, their)}")
    if args.write:
        OUT.write_text(json.dumps(data, indent=1) + "\n")
        print(f"\n-> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
