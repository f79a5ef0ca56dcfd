"""fp8's real gain, by scaling recipe (chapter 1): the step in bf16 over the step in fp8, on the learner's plan.

**The saying:** "fp8 doubles throughput". The chip's fp8 peak is twice its bf16 peak on Hopper and Blackwell
(H100 SXM: 1,979 vs 989.5 dense TFLOP/s), so a GEMM alone, large enough to run at the peak and given its
operands already in fp8, does run about 2x faster. **The measured truth** is far below: torchtitan's
Float8 on Llama 3.1 8B, H100, FSDP + torch.compile: 6,667 -> 8,532 tokens/s per GPU on 8 GPUs (+28 %)
and 6,514 -> 8,380 on 128 (+29 %) (pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md,
Tables 1 and 3); Megatron-Bridge's DeepSeek-V3 tables, BF16 -> FP8, 1.13-1.28x
(``preflight.models.throughput.fp8_gain``'s sources).

Why, in the step model's terms (``preflight.chapters.step``, ``preflight.models.throughput``):

1. only the linear layers' three GEMMs (forward, input gradient, weight gradient) run in fp8; attention's
   batched matmuls, norms, activations, the optimizer, communication and the serial part stay as they
   were: Amdahl on the GEMMs' share of the step;
2. fp8 shortens a GEMM's math, not its shape's overhead (``throughput.fp8_gemm_speedup``): 1.67x at
   h = 4,096, 1.89x at h = 16,384 on a 2x peak;
3. each GEMM operand is quantised first, a memory-bound pass per element whose bytes depend on the recipe
   (``throughput.FP8_CAST_BYTES``): delayed scaling takes the amax from history (4 B per element), current
   scaling (torchao's tensorwise, rowwise) reads the tensor once more for its amax (6 B), blockwise
   (DeepSeek-V3) and MXFP8 (Blackwell's blocks of 32) write a scale per block in the same pass;
4. where communication hides behind compute, faster GEMMs leave less to hide it behind: the exposed part
   grows and eats the gain (:func:`why`).

So 2x holds for a GEMM-only workload with large shapes and its inputs already quantised (no casts): the
table's "GEMMs alone" column. This module times the profile three ways with the one step model, changing
only ``training.fp8`` / ``training.fp8_recipe`` (and, for the middle column, timing the model without its
recipe, so the casts are left out): bf16; fp8 GEMMs without casts; fp8 with the recipe's casts. The step
model does not know torch.compile's fusions or a framework's own fp8 kernels
(amax and cast fused into the previous op): the chapter shows its figure beside the measured ones, and a
measured pair on your own job (one step in bf16, one in fp8) decides.
"""
from __future__ import annotations

from dataclasses import replace

import pandas as pd

from preflight.chapters import step as S
from preflight.core import hardware
from preflight.core.profile import Profile
from preflight.models import throughput as T

RECIPES = tuple(T.FP8_CAST_BYTES)            # delayed, tensorwise, rowwise, blockwise, mxfp8
RECIPE_WORDS = {
    "delayed": "Transformer Engine's DelayedScaling (amax from history)",
    "tensorwise": "torchao Float8, one scale per tensor (current scaling)",
    "rowwise": "torchao Float8, one scale per row (current scaling)",
    "blockwise": "DeepSeek-V3's 1x128 / 128x128 blocks",
    "mxfp8": "MXFP8, blocks of 32 with an 8-bit scale (Blackwell)",
}
BLACKWELL_ONLY = {"mxfp8"}                   # MX formats need Blackwell's tensor cores
# Published end-to-end gains (tokens/s per GPU, bf16 -> fp8), the same layout and software otherwise.
MEASURED = (
    {"run": "torchtitan, Llama 3.1 8B, 8 H100, FSDP + torch.compile + Float8 (tensorwise)", "bf16": 6667.0,
     "fp8": 8532.0, "source": "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 1"},
    {"run": "torchtitan, Llama 3.1 8B, 128 H100, FSDP + torch.compile + Float8 (tensorwise)", "bf16": 6514.0,
     "fp8": 8380.0, "source": "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 3"},
    {"run": "Megatron-Bridge 25.11, DeepSeek-V3, 256 GB300, PP 2 x VP 4 x EP 32 (BF16 -> FP8-MX)", "bf16": 3848.0,
     "fp8": 4357.0, "source": "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md, 25.11, DGX-GB300 "
                              "(Apache-2.0)"},
)
BRIDGE_DEEPSEEK = (1.13, 1.28)               # Megatron-Bridge, DeepSeek-V3 BF16 -> FP8 (throughput.fp8_gain)


def chip_key(profile: Profile, gpu_key: str | None = None) -> str | None:
    """The GPU the step model times: the profile's, or ``gpu_key`` (this machine's) under ``gpu: auto``."""
    return gpu_key if profile.cluster.gpu == "auto" else profile.cluster.gpu


def why_not(chip: str | None, recipe: str) -> str | None:
    """Why ``recipe`` cannot run on ``chip`` (None: it can). ValueError for an unknown recipe."""
    if recipe not in RECIPES:
        raise ValueError(f"training.fp8_recipe = {recipe!r}: accepted {', '.join(RECIPES)}")
    c = hardware.lookup(chip)
    if c is None or c.bf16_tflops is None:
        return f"cluster.gpu = {chip!r}: no known peak, so no step to time (name a GPU of `python -m preflight chips`)"
    if not c.fp8_tflops:
        return f"{chip} has no fp8 tensor cores (A100 and older): fp8 cannot run there"
    if recipe in BLACKWELL_ONLY and T.chip_generation(chip) != "blackwell":
        return f"{recipe} needs Blackwell's MX tensor cores (B200, GB200, B300, GB300); {chip} has none"
    return None


def _training(profile: Profile, **fields) -> Profile:
    return profile.model_copy(update={"training": profile.training.model_copy(update=fields)})


def recipe_row(profile: Profile, recipe: str, gpu_key: str | None = None) -> dict:
    """One recipe on the profile's plan: the step in bf16, with fp8 GEMMs but no casts, and with the
    recipe's casts (the step model's), their ratios, and ``why`` when it cannot run (gains None)."""
    chip = chip_key(profile, gpu_key)
    row = {"recipe": recipe, "words": RECIPE_WORDS.get(recipe, ""), "why_not": why_not(chip, recipe),
           "gemm_gain": None, "bf16_step_s": None, "fp8_no_casts_s": None, "fp8_step_s": None, "casts_s": None,
           "gain_no_casts": None, "gain": None, "bf16_compute_s": None, "fp8_compute_s": None,
           "bf16_exposed_s": None, "fp8_exposed_s": None}
    if row["why_not"]:
        return row
    c = hardware.lookup(chip)
    if profile.cluster.gpu == "auto":           # the step model reads the fp8 peak from cluster.gpu
        profile = profile.model_copy(update={"cluster": profile.cluster.model_copy(update={"gpu": chip})})
    bf16, fp8 = _training(profile, fp8=False), _training(profile, fp8=True, fp8_recipe=recipe)
    pb, pf = S.plan_step(bf16, chip), S.plan_step(fp8, chip)
    step_bf16, step_fp8 = pb.step_s, pf.step_s
    exposed = lambda ps: sum(ps.terms[k] for k in S.EXPOSED_COMM)
    uncast = replace(S.model_of(fp8), fp8_recipe=None)                  # fp8 GEMMs, their casts not timed
    no_casts = S.time_layout(fp8, S.layout_of(fp8), S.cluster_of(fp8, chip), model=uncast).step_s
    row.update(gemm_gain=T.fp8_gain(chip, c.fp8_tflops, c.bf16_tflops), bf16_step_s=step_bf16,
               fp8_no_casts_s=no_casts, fp8_step_s=step_fp8, casts_s=step_fp8 - no_casts,
               gain_no_casts=step_bf16 / no_casts, gain=step_bf16 / step_fp8,
               bf16_compute_s=pb.terms["compute_s"], fp8_compute_s=pf.terms["compute_s"],
               bf16_exposed_s=exposed(pb), fp8_exposed_s=exposed(pf))
    return row


def why(row: dict) -> str:
    """One sentence on what keeps a recipe's gain below the GEMMs' own: the exposed communication fp8 uncovers,
    the casts, or the share of the step that stays bf16."""
    if row["why_not"]:
        return row["why_not"]
    saved = row["bf16_compute_s"] - row["fp8_compute_s"]
    uncovered = row["fp8_exposed_s"] - row["bf16_exposed_s"]
    out = (f"On this plan fp8 shortens compute by {saved:.3g} s a step ({row['bf16_compute_s']:.3g} -> "
           f"{row['fp8_compute_s']:.3g} s: only the linear layers' GEMM math speeds up)")
    if uncovered > 0.1 * saved:
        out += (f"; {uncovered:.3g} s of it comes back as exposed communication ({row['bf16_exposed_s']:.3g} -> "
                f"{row['fp8_exposed_s']:.3g} s), which the shorter compute no longer hides: this step is "
                "communication-bound, and overlapping or shrinking the communication (chapter 3) pays before fp8")
    out += f"; the {row['recipe']} casts add {row['casts_s'] * 1e3:.3g} ms."
    return out


def display_table(profile: Profile, gpu_key: str | None = None) -> pd.DataFrame:
    """The chapter's table: per recipe the step, its compute and exposed communication in bf16 and in fp8, the
    casts in ms, and the gains as ratios with three decimals (a recipe's difference is often under 1 %)."""
    rows = []
    for r in (recipe_row(profile, x, gpu_key) for x in RECIPES):
        if r["why_not"]:
            rows.append({"recipe": f"{r['recipe']}: {r['words']}", "cannot run because": r["why_not"]})
            continue
        rows.append({"recipe": f"{r['recipe']}: {r['words']}",
                     "step bf16 -> fp8 (s)": f"{r['bf16_step_s']:.3f} -> {r['fp8_step_s']:.3f}",
                     "compute (s)": f"{r['bf16_compute_s']:.3f} -> {r['fp8_compute_s']:.3f}",
                     "exposed comm (s)": f"{r['bf16_exposed_s']:.3f} -> {r['fp8_exposed_s']:.3f}",
                     "casts (ms)": f"{r['casts_s'] * 1e3:.1f}", "gain: a GEMM alone": f"{r['gemm_gain']:.2f}x",
                     "gain: step, no casts": f"{r['gain_no_casts']:.3f}x", "the real gain": f"{r['gain']:.3f}x",
                     "cannot run because": ""})
    return pd.DataFrame(rows).fillna("")


def gain(profile: Profile, recipe: str, gpu_key: str | None = None) -> float | None:
    """The real gain, step bf16 / step fp8, of ``recipe`` on the profile's plan; None where it cannot run."""
    return recipe_row(profile, recipe, gpu_key)["gain"]


def recipe_table(profile: Profile, gpu_key: str | None = None) -> pd.DataFrame:
    """:func:`recipe_row` for every recipe (rows that cannot run keep their ``why_not`` and no numbers)."""
    return pd.DataFrame([recipe_row(profile, r, gpu_key) for r in RECIPES])


def fp8_subject(profile: Profile, gpu_key: str | None = None) -> tuple[Profile, str]:
    """The plan whose fp8 gain the chapter times: the profile's, or the same plan on H100 SXM where its GPU
    has no fp8 (or no known peak); and a sentence saying which."""
    chip = chip_key(profile, gpu_key)
    reason = why_not(chip, "delayed")
    if reason is None:
        return profile, f"your plan on {chip}"
    other = profile.model_copy(update={"cluster": profile.cluster.model_copy(update={"gpu": "H100-SXM"})})
    return other, f"your plan on H100-SXM ({reason})"


def measured_table() -> pd.DataFrame:
    """The published bf16 -> fp8 pairs and their gains (``MEASURED``)."""
    return pd.DataFrame([{**m, "gain": m["fp8"] / m["bf16"]} for m in MEASURED])
