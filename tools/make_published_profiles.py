"""Writes the Megatron-Bridge, torchtitan and DeepSeek-V3 published runs as plan profiles.

    python tools/make_published_profiles.py        # rewrites data/profiles/bridge/ and data/profiles/heldout/

Each row below is one published table row, copied as printed: the source's layout and its tokens/s per GPU.
What a table does not print (recompute, expert tensor parallelism, all-to-all overlap, Megatron-FSDP) is read
from the framework's recipe and named in each profile's header. Two sets, never mixed:

* ``bridge/``  -- the calibration (fit) set: Megatron-Bridge's 26.08 summary and its archive's 26.06.01 and 26.06.
* ``heldout/`` -- the evaluation set: Megatron-Bridge's older releases (26.04.01 .. 25.11), torchtitan's
  benchmark tables beyond the two rows already in data/profiles/published/, DeepSeek-V3's report.

A row whose layout the profile refuses today is written to ``<set>/pending/`` (ignored by the loader) with the
reason; rows that cannot be expressed at all are listed in each folder's README, not written.
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from preflight.core.profile import Profile  # noqa: E402

BRIDGE_COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
TT_COMMIT = "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"

# --- Model shapes: the models' published configs (Hugging Face config.json; field names in brackets) ------------
MODELS = {
    "llama31-405b": dict(
        src="meta-llama/Llama-3.1-405B config.json (num_hidden_layers 126, hidden_size 16384, num_attention_heads 128, "
            "num_key_value_heads 8, intermediate_size 53248, vocab_size 128256); 405.85e9 parameters (model card)",
        m=dict(params=405.85e9, layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, vocab=128256)),
    "llama3-70b": dict(
        src="meta-llama/Meta-Llama-3-70B config.json (80 layers, hidden 8192, 64 heads, 8 kv heads, intermediate "
            "28672, vocab 128256); 70.55e9 parameters",
        m=dict(params=70.55e9, layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128256)),
    "llama3-8b": dict(
        src="meta-llama/Meta-Llama-3-8B config.json (32 layers, hidden 4096, 32 heads, 8 kv heads, intermediate 14336, "
            "vocab 128256; Llama 3.1 8B has the same shape); 8.03e9 parameters",
        m=dict(params=8.03e9, layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)),
    "deepseek-v3": dict(
        src="deepseek-ai/DeepSeek-V3 config.json / inference/configs/config_671B.json (num_hidden_layers 61, "
            "first_k_dense_replace 3 -> 58 MoE layers, hidden_size 7168, 128 heads, MLA: qk_nope 128 + qk_rope 64 = 192, "
            "v_head_dim 128, q_lora_rank 1536, kv_lora_rank 512, intermediate_size 18432, moe_intermediate_size 2048, "
            "n_routed_experts 256, "
            "num_experts_per_tok 8, n_shared_experts 1, vocab_size 129280); 671e9 parameters without the MTP module "
            "(report, Section 1)",
        m=dict(params=671e9, layers=61, hidden=7168, heads=128, ffn_hidden=18432, vocab=129280, experts=256, top_k=8,
               shared_experts=1, expert_ffn_hidden=2048, moe_layers=58, qk_head_dim=192, v_head_dim=128,
               q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64)),
    "qwen3-30b-a3b": dict(
        src="Qwen/Qwen3-30B-A3B config.json (48 layers all MoE, hidden 2048, 32 heads, 4 kv heads, head_dim 128, "
            "intermediate 6144, moe_intermediate_size 768, num_experts 128, num_experts_per_tok 8, vocab 151936); "
            "30.5e9 parameters (model card)",
        m=dict(params=30.53e9, layers=48, hidden=2048, heads=32, kv_heads=4, ffn_hidden=6144, vocab=151936,
               experts=128, top_k=8, expert_ffn_hidden=768, moe_layers=48, qk_head_dim=128, v_head_dim=128)),
    "qwen3-235b-a22b": dict(
        src="Qwen/Qwen3-235B-A22B config.json (94 layers all MoE, hidden 4096, 64 heads, 4 kv heads, head_dim 128, "
            "intermediate 12288, moe_intermediate_size 1536, num_experts 128, num_experts_per_tok 8, vocab 151936); "
            "235e9 parameters (model card)",
        m=dict(params=235.09e9, layers=94, hidden=4096, heads=64, kv_heads=4, ffn_hidden=12288, vocab=151936,
               experts=128, top_k=8, expert_ffn_hidden=1536, moe_layers=94, qk_head_dim=128, v_head_dim=128)),
    "gpt-oss-120b": dict(
        src="openai/gpt-oss-120b config.json (36 layers all MoE, hidden 2880, 64 heads, 8 kv heads, head_dim 64, "
            "intermediate_size 2880 per expert, num_local_experts 128, experts_per_token 4, vocab 201088; every other "
            "layer a 128-token sliding window, not modelled: planned as full causal attention); 116.8e9 parameters "
            "(model card)",
        m=dict(params=116.83e9, layers=36, hidden=2880, heads=64, kv_heads=8, ffn_hidden=2880, vocab=201088,
               experts=128, top_k=4, expert_ffn_hidden=2880, moe_layers=36, qk_head_dim=64, v_head_dim=64)),
}

# --- Machines: one row per system name in the sources ------------------------------------------------------------
SYSTEMS = {
    "DGX-H100": dict(gpu="H100-SXM", gpn=8, intra=450, inter=400, note="DGX H100: 8 GPUs, NVLink 450 GB/s one way, "
                     "ConnectX-7 400 Gb/s per GPU"),
    "DGX-B200": dict(gpu="B200", gpn=8, intra=900, inter=400, note="DGX B200: 8 GPUs, NVLink 5 900 GB/s one way, "
                     "ConnectX-7 400 Gb/s per GPU"),
    "DGX-GB200": dict(gpu="GB200", gpn=4, intra=900, inter=400, note="DGX GB200 NVL72: 4 GPUs per compute tray, "
                      "72 per NVLink domain (the recipes' NVLINK_DOMAIN_SIZE 72, 64 EP ranks per domain), NVLink 5 "
                      "900 GB/s one way, ConnectX-7 400 Gb/s per GPU"),
    "GT-H100-96": dict(gpu="H100-SXM", gpn=8, intra=450, inter=400, mem=96, note="Grand Teton: 8 H100 96GB HBM2e "
                       "at 500 W (real peak below the SXM figure, the source's footnote), 400 Gb/s RDMA per GPU"),
    "H200-WF": dict(gpu="H200-SXM", gpn=8, intra=450, inter=400, note="WhiteFiber: 8 H200 per host, NVLink, "
                    "ConnectX-7 400 Gb/s per GPU"),
    "H800": dict(gpu="H100-SXM", gpn=8, intra=160, inter=400, note="H800 is not a chip key: an H100 SXM with NVLink "
                 "cut to 400 GB/s both ways (~160 GB/s achievable one way, the report's Section 3.2.2), so H100-SXM "
                 "with intra_node_GBps 160; InfiniBand 400 Gb/s per GPU (~50 GB/s, the report)"),
}
SYSTEMS.update({
    "DGX-GB300": dict(gpu="GB300", gpn=4, intra=900, inter=800, note="DGX GB300 NVL72: 4 GPUs per compute tray, 72 "
                      "per NVLink domain, NVLink 5 900 GB/s one way, ConnectX-8 800 Gb/s per GPU"),
    "DGX-B300": dict(gpu="B300", gpn=8, intra=900, inter=800, note="DGX B300: 8 GPUs, NVLink 5 900 GB/s one way, "
                     "ConnectX-8 800 Gb/s per GPU"),
})

# fp8 recipes by the sources' precision names: Megatron-Bridge's FP8 is fp8_cs (Transformer Engine
# Float8CurrentScaling, one scale per tensor from the current amax = tensorwise; scripts/performance README),
# MXFP8 its fp8_mx (MX blocks of 32).
PRECISION = {"BF16": (False, None), "FP8": (True, "tensorwise"), "FP8-CS": (True, "tensorwise"),
             "MXFP8": (True, "mxfp8"), "FP8-MX": (True, "mxfp8"), "float8 tensorwise": (True, "tensorwise"),
             "float8 rowwise": (True, "rowwise"), "FP8-blockwise": (True, "blockwise")}

# Bridge table columns: release, model, system, gpus, precision, gbs, mbs, seq, fsdp, tp, pp, cp, vp, ep, tok/s/GPU
# (vp/ep None = "n/a" / "1"; fsdp 0 = DDP + distributed optimizer; a trailing dict adds a note or the task)
FIT = [
    ("26.08", "deepseek-v3", "DGX-GB200", 256, "MXFP8", 4096, 1, 4096, 0, 1, 4, 1, 4, 64, 4912),
    ("26.08", "gpt-oss-120b", "DGX-GB200", 64, "MXFP8", 1280, 4, 4096, 0, 1, 1, 1, None, 64, 28672),
    ("26.08", "qwen3-30b-a3b", "DGX-GB200", 8, "MXFP8", 512, 4, 4096, 0, 1, 1, 1, None, 8, 39936),
    ("26.08", "qwen3-235b-a22b", "DGX-GB200", 256, "MXFP8", 8192, 1, 4096, 0, 1, 8, 1, 3, 32, 7280),
    ("26.06.01", "deepseek-v3", "DGX-GB200", 256, "MXFP8", 4096, 1, 4096, 0, 1, 4, 1, 4, 64, 4928),
    ("26.06.01", "gpt-oss-120b", "DGX-GB200", 64, "MXFP8", 1280, 4, 4096, 0, 1, 1, 1, None, 64, 18304,
     {"note": "the source's footnote: a performance regression (cudnn-frontend issue 256), fixed in the next release"}),
    ("26.06.01", "qwen3-30b-a3b", "DGX-GB200", 8, "MXFP8", 512, 4, 4096, 0, 1, 1, 1, None, 8, 40960),
    ("26.06.01", "qwen3-235b-a22b", "DGX-GB200", 256, "MXFP8", 8192, 1, 4096, 0, 1, 8, 1, 3, 32, 7360),
    ("26.06", "llama31-405b", "DGX-GB200", 256, "FP8", 1536, 1, 8192, 0, 4, 16, 1, 4, None, 843),
    ("26.06", "llama31-405b", "DGX-GB200", 256, "MXFP8", 1536, 1, 8192, 0, 4, 16, 1, 8, None, 783),
    ("26.06", "llama31-405b", "DGX-H100", 1024, "FP8", 1536, 1, 8192, 0, 8, 8, 2, 8, None, 326),
    ("26.06", "deepseek-v3", "DGX-GB200", 256, "MXFP8", 4096, 1, 4096, 0, 1, 4, 1, 4, 64, 4969),
    ("26.06", "gpt-oss-120b", "DGX-GB200", 64, "MXFP8", 1280, 4, 4096, 0, 1, 1, 1, None, 64, 28947),
    ("26.06", "qwen3-30b-a3b", "DGX-GB200", 8, "MXFP8", 512, 4, 4096, 0, 1, 1, 1, None, 8, 40706),
    ("26.06", "qwen3-30b-a3b", "DGX-H100", 16, "FP8", 1024, 1, 4096, 0, 1, 1, 1, None, 16, 8826),
    ("26.06", "qwen3-235b-a22b", "DGX-GB200", 256, "MXFP8", 8192, 1, 4096, 0, 1, 8, 1, 3, 32, 7376),
    ("26.06", "llama3-70b", "DGX-GB200", 32, "FP8", 32, 1, 4096, 0, 1, 8, 1, 10, None, 3864, {"task": "sft"}),
    ("26.06", "llama3-70b", "DGX-GB200", 32, "MXFP8", 32, 1, 4096, 0, 1, 8, 1, 10, None, 3593, {"task": "sft"}),
    ("26.06", "llama3-70b", "DGX-H100", 32, "FP8", 32, 1, 4096, 0, 4, 4, 1, 5, None, 1638, {"task": "sft"}),
    # Blackwell Ultra (GB300 NVL72, DGX B300), the same three releases
    ("26.08", "deepseek-v3", "DGX-GB300", 256, "MXFP8", 4096, 1, 4096, 0, 1, 2, 1, 8, 32, 6288),
    ("26.08", "gpt-oss-120b", "DGX-GB300", 64, "MXFP8", 1280, 4, 4096, 0, 1, 1, 1, None, 16, 33024),
    ("26.08", "qwen3-30b-a3b", "DGX-GB300", 8, "MXFP8", 512, 8, 4096, 0, 1, 1, 1, None, 8, 44544),
    ("26.08", "qwen3-235b-a22b", "DGX-GB300", 256, "MXFP8", 8192, 2, 4096, 0, 1, 4, 1, 12, 32, 8816),
    ("26.06.01", "deepseek-v3", "DGX-GB300", 256, "MXFP8", 4096, 1, 4096, 0, 1, 2, 1, 8, 32, 6304),
    ("26.06.01", "gpt-oss-120b", "DGX-GB300", 64, "MXFP8", 1280, 4, 4096, 0, 1, 1, 1, None, 16, 20288,
     {"note": "the source's footnote: a performance regression (cudnn-frontend issue 256), fixed in the next release"}),
    ("26.06.01", "qwen3-30b-a3b", "DGX-GB300", 8, "MXFP8", 512, 8, 4096, 0, 1, 1, 1, None, 8, 44544),
    ("26.06.01", "qwen3-235b-a22b", "DGX-GB300", 256, "MXFP8", 8192, 2, 4096, 0, 1, 4, 1, 12, 32, 9008),
    ("26.06", "llama31-405b", "DGX-GB300", 256, "FP8", 1536, 1, 8192, 0, 4, 8, 1, 4, None, 1048),
    ("26.06", "llama31-405b", "DGX-GB300", 256, "MXFP8", 1536, 1, 8192, 0, 2, 8, 2, 4, None, 952),
    ("26.06", "deepseek-v3", "DGX-GB300", 256, "MXFP8", 4096, 1, 4096, 0, 1, 2, 1, 8, 32, 6338),
    ("26.06", "deepseek-v3", "DGX-GB300", 256, "MXFP8", 15360, 1, 4096, 0, 1, 2, 1, 8, 32, 6422, {"suffix": "gbs15360"}),
    ("26.06", "gpt-oss-120b", "DGX-GB300", 64, "MXFP8", 1280, 4, 4096, 0, 1, 1, 1, None, 16, 33166),
    ("26.06", "qwen3-30b-a3b", "DGX-GB300", 8, "MXFP8", 512, 8, 4096, 0, 1, 1, 1, None, 8, 45275),
    ("26.06", "qwen3-235b-a22b", "DGX-GB300", 256, "MXFP8", 8192, 2, 4096, 0, 1, 4, 1, 12, 32, 9015),
    ("26.06", "llama3-70b", "DGX-GB300", 32, "FP8", 32, 1, 4096, 0, 1, 2, 1, 20, None, 4819, {"task": "sft"}),
    ("26.06", "llama3-70b", "DGX-GB300", 32, "MXFP8", 32, 1, 4096, 0, 1, 2, 1, 20, None, 4312, {"task": "sft"}),
    ("26.06", "deepseek-v3", "DGX-B300", 256, "MXFP8", 4096, 2, 4096, 0, 1, 8, 1, None, 8, 3541),
    ("26.06", "gpt-oss-120b", "DGX-B300", 64, "MXFP8", 1280, 4, 4096, 0, 1, 1, 1, None, 8, 18534),
    ("26.06", "qwen3-30b-a3b", "DGX-B300", 8, "MXFP8", 512, 8, 4096, 0, 1, 1, 1, None, 8, 40769),
]

HELDOUT_BRIDGE = [
    # 26.04.01
    ("26.04.01", "llama3-70b", "DGX-GB200", 64, "FP8", 256, 2, 8192, 64, 1, 1, 1, None, None, 4224),
    ("26.04.01", "llama3-70b", "DGX-GB200", 64, "MXFP8", 256, 1, 8192, 0, 2, 4, 1, 5, None, 3712),
    ("26.04.01", "llama3-70b", "DGX-H100", 64, "FP8", 256, 1, 8192, 0, 4, 8, 1, 5, None, 1664),
    ("26.04.01", "llama31-405b", "DGX-GB200", 256, "FP8", 1536, 1, 8192, 0, 4, 16, 1, 4, None, 864),
    ("26.04.01", "llama31-405b", "DGX-GB200", 256, "MXFP8", 1536, 1, 8192, 0, 4, 16, 1, 8, None, 800),
    ("26.04.01", "llama31-405b", "DGX-H100", 1024, "FP8", 1536, 1, 8192, 0, 8, 8, 2, 8, None, 328),
    ("26.04.01", "deepseek-v3", "DGX-GB200", 256, "MXFP8", 4096, 1, 4096, 0, 1, 4, 1, 4, 64, 4256),
    ("26.04.01", "deepseek-v3", "DGX-B200", 256, "MXFP8", 4096, 1, 4096, 0, 1, 8, 1, 2, 32, 3328),
    ("26.04.01", "gpt-oss-120b", "DGX-GB200", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 64, 16640),
    ("26.04.01", "gpt-oss-120b", "DGX-B200", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 8, 13568),
    ("26.04.01", "gpt-oss-120b", "DGX-H100", 64, "BF16", 1280, 1, 4096, 0, 1, 4, 1, None, 8, 5824),
    ("26.04.01", "qwen3-30b-a3b", "DGX-GB200", 8, "MXFP8", 512, 4, 4096, 0, 1, 1, 1, None, 8, 26112),
    ("26.04.01", "qwen3-30b-a3b", "DGX-B200", 8, "MXFP8", 512, 4, 4096, 0, 1, 1, 1, None, 8, 27136),
    ("26.04.01", "qwen3-30b-a3b", "DGX-H100", 16, "FP8", 1024, 1, 4096, 0, 1, 1, 1, None, 16, 8960),
    ("26.04.01", "qwen3-235b-a22b", "DGX-GB200", 256, "MXFP8", 8192, 1, 4096, 0, 1, 8, 1, 3, 32, 5680),
    ("26.04.01", "qwen3-235b-a22b", "DGX-B200", 256, "MXFP8", 8192, 1, 4096, 0, 1, 8, 1, None, 8, 3776),
    ("26.04.01", "qwen3-235b-a22b", "DGX-H100", 256, "FP8", 8192, 1, 4096, 0, 2, 8, 1, 4, 32, 1712),
    # 26.04
    ("26.04", "llama3-70b", "DGX-GB200", 64, "MXFP8", 256, 1, 8192, 0, 2, 4, 1, 5, None, 3828),
    ("26.04", "llama3-70b", "DGX-GB200", 64, "FP8", 256, 2, 8192, 64, 1, 1, 1, None, None, 4143),
    ("26.04", "llama3-70b", "DGX-H100", 64, "FP8", 256, 1, 8192, 0, 4, 8, 1, 5, None, 1633),
    ("26.04", "llama31-405b", "DGX-GB200", 256, "MXFP8", 1536, 1, 8192, 0, 4, 16, 1, 8, None, 793),
    ("26.04", "llama31-405b", "DGX-GB200", 256, "FP8", 1536, 1, 8192, 0, 4, 16, 1, 4, None, 842),
    ("26.04", "deepseek-v3", "DGX-GB200", 256, "MXFP8", 4096, 1, 4096, 0, 1, 4, 1, 4, 64, 4193),
    ("26.04", "deepseek-v3", "DGX-B200", 256, "MXFP8", 4096, 1, 4096, 0, 1, 16, 1, None, 8, 2815),
    ("26.04", "gpt-oss-120b", "DGX-GB200", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 64, 15938),
    ("26.04", "gpt-oss-120b", "DGX-B200", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 8, 13045),
    ("26.04", "gpt-oss-120b", "DGX-H100", 64, "BF16", 1280, 1, 4096, 0, 1, 4, 1, None, 8, 5810),
    ("26.04", "qwen3-30b-a3b", "DGX-GB200", 8, "MXFP8", 512, 4, 4096, 0, 1, 1, 1, None, 8, 26032),
    ("26.04", "qwen3-30b-a3b", "DGX-B200", 8, "MXFP8", 512, 4, 4096, 0, 1, 1, 1, None, 8, 26859),
    ("26.04", "qwen3-30b-a3b", "DGX-H100", 16, "FP8", 1024, 1, 4096, 0, 1, 1, 1, None, 16, 8901),
    ("26.04", "qwen3-235b-a22b", "DGX-GB200", 256, "MXFP8", 8192, 1, 4096, 0, 1, 8, 1, 3, 32, 5672),
    ("26.04", "qwen3-235b-a22b", "DGX-H100", 256, "FP8", 8192, 1, 4096, 0, 2, 8, 1, 4, 32, 1686),
    # 26.02.01
    ("26.02.01", "llama3-70b", "DGX-GB200", 64, "MXFP8", 256, 1, 8192, 0, 2, 4, 1, 5, None, 3837),
    ("26.02.01", "llama3-70b", "DGX-GB200", 64, "FP8", 256, 2, 8192, 64, 1, 1, 1, None, None, 4357),
    ("26.02.01", "llama3-70b", "DGX-H100", 64, "FP8", 256, 1, 8192, 0, 4, 8, 1, 5, None, 1639),
    ("26.02.01", "llama31-405b", "DGX-GB200", 256, "MXFP8", 1536, 1, 8192, 0, 4, 16, 1, 8, None, 775),
    ("26.02.01", "llama31-405b", "DGX-GB200", 256, "FP8", 1536, 1, 8192, 0, 4, 16, 1, 4, None, 818),
    ("26.02.01", "deepseek-v3", "DGX-GB200", 256, "MXFP8", 4096, 1, 4096, 0, 1, 4, 1, 4, 64, 4021),
    ("26.02.01", "deepseek-v3", "DGX-B200", 256, "MXFP8", 4096, 1, 4096, 0, 1, 16, 1, None, 8, 2790),
    ("26.02.01", "gpt-oss-120b", "DGX-GB200", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 64, 15754),
    ("26.02.01", "gpt-oss-120b", "DGX-B200", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 8, 13722),
    ("26.02.01", "gpt-oss-120b", "DGX-H100", 64, "BF16", 1280, 1, 4096, 0, 1, 4, 1, None, 8, 5984),
    ("26.02.01", "qwen3-30b-a3b", "DGX-GB200", 8, "MXFP8", 512, 4, 4096, 0, 1, 1, 1, None, 8, 26373),
    ("26.02.01", "qwen3-30b-a3b", "DGX-B200", 8, "MXFP8", 512, 4, 4096, 0, 1, 1, 1, None, 8, 26695),
    ("26.02.01", "qwen3-30b-a3b", "DGX-H100", 16, "FP8", 1024, 1, 4096, 0, 1, 2, 1, 12, 8, 9058),
    ("26.02.01", "qwen3-235b-a22b", "DGX-GB200", 256, "MXFP8", 8192, 1, 4096, 0, 1, 8, 1, None, 32, 5530),
    ("26.02.01", "qwen3-235b-a22b", "DGX-H100", 256, "FP8", 8192, 1, 4096, 0, 2, 8, 1, 4, 32, 1611),
    # 26.02
    ("26.02", "llama3-70b", "DGX-GB200", 64, "MXFP8", 256, 1, 8192, 0, 2, 4, 1, 5, None, 3613),
    ("26.02", "llama3-70b", "DGX-GB200", 64, "FP8", 256, 2, 8192, 64, 1, 1, 1, None, None, 4040),
    ("26.02", "llama3-70b", "DGX-H100", 64, "FP8", 256, 1, 8192, 0, 4, 8, 1, 5, None, 1621),
    ("26.02", "llama31-405b", "DGX-GB200", 256, "MXFP8", 1536, 1, 8192, 0, 4, 16, 1, 8, None, 786),
    ("26.02", "llama31-405b", "DGX-GB200", 256, "FP8", 1536, 1, 8192, 0, 4, 16, 1, 4, None, 793),
    ("26.02", "llama31-405b", "DGX-H100", 1024, "FP8", 1536, 1, 8192, 0, 8, 8, 2, 8, None, 311),
    ("26.02", "deepseek-v3", "DGX-GB200", 256, "MXFP8", 4096, 1, 4096, 0, 1, 4, 1, 4, 64, 3955),
    ("26.02", "deepseek-v3", "DGX-B200", 256, "MXFP8", 4096, 1, 4096, 0, 1, 16, 1, None, 8, 2689),
    ("26.02", "gpt-oss-120b", "DGX-GB200", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 64, 15784),
    ("26.02", "gpt-oss-120b", "DGX-B200", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 64, 8047),
    ("26.02", "gpt-oss-120b", "DGX-H100", 64, "BF16", 1280, 1, 4096, 0, 1, 4, 1, None, 8, 5993),
    ("26.02", "qwen3-30b-a3b", "DGX-GB200", 8, "MXFP8", 512, 4, 4096, 0, 1, 1, 1, None, 8, 26084),
    ("26.02", "qwen3-30b-a3b", "DGX-B200", 8, "MXFP8", 512, 1, 4096, 0, 1, 1, 1, None, 8, 9691),
    ("26.02", "qwen3-30b-a3b", "DGX-H100", 16, "FP8", 1024, 1, 4096, 0, 1, 2, 1, 12, 8, 5113),
    ("26.02", "qwen3-235b-a22b", "DGX-GB200", 256, "MXFP8", 8192, 1, 4096, 0, 1, 8, 1, None, 32, 5448),
    ("26.02", "qwen3-235b-a22b", "DGX-B200", 256, "MXFP8", 8192, 1, 4096, 0, 1, 8, 1, None, 8, 3805),
    ("26.02", "qwen3-235b-a22b", "DGX-H100", 256, "FP8", 8192, 1, 4096, 0, 2, 8, 1, 4, 32, 1633),
    # 25.11 (per-system tables; "FP8-CS (FP8-MX)" = two runs; VP 1 = no interleaving)
    ("25.11", "llama3-8b", "DGX-GB200", 8, "FP8-CS", 128, 2, 8192, 0, 1, 1, 1, None, None, 31508),
    ("25.11", "llama3-8b", "DGX-GB200", 8, "FP8-MX", 128, 2, 8192, 0, 1, 1, 1, None, None, 29789),
    ("25.11", "llama3-70b", "DGX-GB200", 64, "FP8-CS", 256, 2, 8192, 64, 1, 1, 1, None, None, 4312),
    ("25.11", "llama31-405b", "DGX-GB200", 256, "FP8-CS", 1536, 1, 8192, 0, 4, 16, 1, 4, None, 813),
    ("25.11", "deepseek-v3", "DGX-GB200", 256, "BF16", 4096, 1, 4096, 0, 1, 4, 1, 4, 64, 3139, {"note": "w/o MTP"}),
    ("25.11", "deepseek-v3", "DGX-GB200", 256, "FP8-MX", 4096, 1, 4096, 0, 1, 8, 1, 4, 32, 4018, {"note": "w/o MTP"}),
    ("25.11", "gpt-oss-120b", "DGX-GB200", 64, "BF16", 1280, 1, 8192, 0, 1, 1, 1, None, 64, 15876),
    ("25.11", "qwen3-30b-a3b", "DGX-GB200", 8, "FP8-MX", 512, 4, 4096, 0, 1, 1, 1, None, 8, 23766),
    ("25.11", "qwen3-235b-a22b", "DGX-GB200", 256, "BF16", 8192, 1, 4096, 0, 1, 8, 1, 3, 32, 4916),
    ("25.11", "llama3-8b", "DGX-B200", 8, "FP8-CS", 128, 2, 8192, 0, 1, 1, 1, None, None, 30624),
    ("25.11", "llama3-8b", "DGX-B200", 8, "FP8-MX", 128, 2, 8192, 0, 1, 1, 1, None, None, 29521),
    ("25.11", "llama31-405b", "DGX-B200", 128, "FP8-CS", 64, 1, 8192, 0, 4, 8, 2, 8, None, 661),
    ("25.11", "llama31-405b", "DGX-B200", 128, "FP8-MX", 64, 1, 8192, 0, 4, 8, 2, 8, None, 624),
    ("25.11", "deepseek-v3", "DGX-B200", 256, "FP8-MX", 2048, 1, 4096, 0, 1, 16, 1, None, 8, 2139,
     {"note": "w/ MTP (one multi-token-prediction module, not in the profile's FLOPs)"}),
    ("25.11", "gpt-oss-120b", "DGX-B200", 64, "BF16", 512, 4, 4096, 0, 1, 1, 1, None, 8, 8213),
    ("25.11", "qwen3-30b-a3b", "DGX-B200", 8, "FP8-MX", 512, 1, 4096, 0, 1, 1, 1, None, 8, 9299),
    ("25.11", "qwen3-235b-a22b", "DGX-B200", 64, "FP8-MX", 1024, 1, 4096, 0, 1, 8, 1, 2, 8, 3269),
    ("25.11", "llama3-8b", "DGX-H100", 8, "FP8-CS", 128, 1, 8192, 8, 1, 1, 1, None, None, 14451),
    ("25.11", "llama3-70b", "DGX-H100", 64, "FP8-CS", 128, 1, 8192, 0, 4, 8, 1, 5, None, 1602),
    ("25.11", "llama31-405b", "DGX-H100", 1024, "FP8-CS", 512, 1, 8192, 0, 8, 8, 2, 8, None, 292),
    ("25.11", "gpt-oss-120b", "DGX-H100", 64, "BF16", 512, 4, 4096, 0, 1, 4, 1, None, 8, 5630),
    ("25.11", "qwen3-30b-a3b", "DGX-H100", 16, "FP8-CS", 512, 2, 4096, 0, 1, 2, 1, 24, 8, 5275),
    ("25.11", "qwen3-235b-a22b", "DGX-H100", 256, "FP8-CS", 2048, 1, 4096, 0, 2, 8, 1, 4, 32, 1575),
    # Blackwell Ultra (DGX-GB300, DGX-B300) rows of the same releases (NVFP4, Nemotron 3 and Kimi K2 left out, as above)
    ("26.04.01", "llama3-70b", "DGX-GB300", 64, "FP8", 256, 2, 8192, 64, 1, 1, 1, None, None, 5248),
    ("26.04.01", "llama3-70b", "DGX-GB300", 64, "MXFP8", 256, 1, 8192, 0, 1, 4, 1, 5, None, 4864),
    ("26.04.01", "llama31-405b", "DGX-GB300", 256, "FP8", 1536, 1, 8192, 0, 4, 8, 1, 4, None, 1024),
    ("26.04.01", "llama31-405b", "DGX-GB300", 256, "MXFP8", 1536, 1, 8192, 0, 2, 8, 2, 4, None, 960),
    ("26.04.01", "deepseek-v3", "DGX-GB300", 256, "MXFP8", 4096, 2, 4096, 0, 1, 2, 1, 8, 32, 4992),
    ("26.04.01", "deepseek-v3", "DGX-B300", 256, "MXFP8", 4096, 2, 4096, 0, 1, 8, 1, None, 8, 3456),
    ("26.04.01", "gpt-oss-120b", "DGX-GB300", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 64, 19200),
    ("26.04.01", "gpt-oss-120b", "DGX-B300", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 8, 15232),
    ("26.04.01", "qwen3-30b-a3b", "DGX-GB300", 8, "MXFP8", 512, 8, 4096, 0, 1, 1, 1, None, 8, 31744),
    ("26.04.01", "qwen3-30b-a3b", "DGX-B300", 8, "MXFP8", 512, 8, 4096, 0, 1, 1, 1, None, 8, 30720),
    ("26.04.01", "qwen3-235b-a22b", "DGX-GB300", 256, "MXFP8", 8192, 2, 4096, 0, 1, 4, 1, 12, 32, 6944),
    ("26.04.01", "qwen3-235b-a22b", "DGX-B300", 256, "MXFP8", 8192, 2, 4096, 0, 1, 8, 1, None, 8, 5936),
    ("26.04", "llama3-70b", "DGX-GB300", 64, "MXFP8", 256, 1, 8192, 0, 1, 4, 1, 5, None, 4742),
    ("26.04", "llama3-70b", "DGX-GB300", 64, "FP8", 256, 2, 8192, 64, 1, 1, 1, None, None, 5243),
    ("26.04", "llama31-405b", "DGX-GB300", 256, "MXFP8", 1536, 1, 8192, 0, 2, 8, 2, 4, None, 968),
    ("26.04", "llama31-405b", "DGX-GB300", 256, "FP8", 1536, 1, 8192, 0, 4, 8, 1, 4, None, 1036),
    ("26.04", "deepseek-v3", "DGX-GB300", 256, "MXFP8", 4096, 2, 4096, 0, 1, 2, 1, 8, 32, 4965),
    ("26.04", "deepseek-v3", "DGX-B300", 256, "MXFP8", 4096, 1, 4096, 0, 1, 16, 1, None, 8, 3131),
    ("26.04", "gpt-oss-120b", "DGX-GB300", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 64, 19275),
    ("26.04", "gpt-oss-120b", "DGX-B300", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 8, 15114),
    ("26.04", "qwen3-30b-a3b", "DGX-GB300", 8, "MXFP8", 512, 8, 4096, 0, 1, 1, 1, None, 8, 31470),
    ("26.04", "qwen3-30b-a3b", "DGX-B300", 8, "MXFP8", 512, 8, 4096, 0, 1, 1, 1, None, 8, 30553),
    ("26.04", "qwen3-235b-a22b", "DGX-GB300", 256, "MXFP8", 8192, 2, 4096, 0, 1, 4, 1, 12, 32, 6994),
    ("26.04", "qwen3-235b-a22b", "DGX-B300", 256, "MXFP8", 8192, 2, 4096, 0, 1, 8, 1, None, 8, 4865),
    ("26.02.01", "llama3-70b", "DGX-GB300", 64, "MXFP8", 256, 2, 8192, 0, 1, 4, 1, None, None, 4798),
    ("26.02.01", "llama3-70b", "DGX-GB300", 64, "FP8", 256, 2, 8192, 64, 1, 1, 1, None, None, 5243),
    ("26.02.01", "llama31-405b", "DGX-GB300", 256, "MXFP8", 1536, 1, 8192, 0, 2, 8, 2, 4, None, 949),
    ("26.02.01", "llama31-405b", "DGX-GB300", 256, "FP8", 1536, 1, 8192, 0, 2, 8, 2, 4, None, 1024),
    ("26.02.01", "deepseek-v3", "DGX-GB300", 256, "MXFP8", 4096, 2, 4096, 0, 1, 2, 1, 8, 32, 4691),
    ("26.02.01", "deepseek-v3", "DGX-B300", 256, "MXFP8", 4096, 1, 4096, 0, 1, 16, 1, None, 8, 3099),
    ("26.02.01", "gpt-oss-120b", "DGX-GB300", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 64, 19366),
    ("26.02.01", "gpt-oss-120b", "DGX-B300", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 8, 15031),
    ("26.02.01", "qwen3-30b-a3b", "DGX-GB300", 8, "MXFP8", 512, 8, 4096, 0, 1, 1, 1, None, 8, 30411),
    ("26.02.01", "qwen3-30b-a3b", "DGX-B300", 8, "MXFP8", 512, 8, 4096, 0, 1, 1, 1, None, 8, 29454),
    ("26.02.01", "qwen3-235b-a22b", "DGX-GB300", 256, "MXFP8", 8192, 2, 4096, 0, 1, 4, 1, None, 32, 6583),
    ("26.02.01", "qwen3-235b-a22b", "DGX-B300", 256, "MXFP8", 8192, 1, 4096, 0, 1, 8, 1, 4, 8, 2644),
    ("26.02", "llama3-70b", "DGX-GB300", 64, "MXFP8", 256, 1, 8192, 0, 1, 4, 1, 5, None, 4596),
    ("26.02", "llama3-70b", "DGX-GB300", 64, "FP8", 256, 2, 8192, 64, 1, 1, 1, None, None, 5003),
    ("26.02", "llama31-405b", "DGX-GB300", 256, "MXFP8", 1536, 1, 8192, 0, 2, 8, 2, 4, None, 931),
    ("26.02", "llama31-405b", "DGX-GB300", 256, "FP8", 1536, 1, 8192, 0, 4, 8, 1, 4, None, 988),
    ("26.02", "deepseek-v3", "DGX-GB300", 256, "MXFP8", 4096, 2, 4096, 0, 1, 2, 1, 8, 32, 4612),
    ("26.02", "deepseek-v3", "DGX-B300", 256, "MXFP8", 4096, 1, 4096, 0, 1, 16, 1, None, 8, 2983),
    ("26.02", "gpt-oss-120b", "DGX-GB300", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 64, 19412),
    ("26.02", "gpt-oss-120b", "DGX-B300", 64, "BF16", 1280, 4, 4096, 0, 1, 1, 1, None, 64, 8359),
    ("26.02", "qwen3-30b-a3b", "DGX-GB300", 8, "MXFP8", 512, 8, 4096, 0, 1, 1, 1, None, 8, 30376),
    ("26.02", "qwen3-30b-a3b", "DGX-B300", 8, "MXFP8", 512, 8, 4096, 0, 1, 1, 1, None, 8, 29521),
    ("26.02", "qwen3-235b-a22b", "DGX-GB300", 256, "MXFP8", 8192, 2, 4096, 0, 1, 4, 1, None, 32, 6583),
    ("26.02", "qwen3-235b-a22b", "DGX-B300", 256, "MXFP8", 8192, 1, 4096, 0, 1, 8, 1, 4, 8, 2691),
    ("25.11", "llama3-8b", "DGX-GB300", 8, "FP8-CS", 128, 2, 8192, 0, 1, 1, 1, None, None, 37556),
    ("25.11", "llama3-8b", "DGX-GB300", 8, "FP8-MX", 128, 2, 8192, 0, 1, 1, 1, None, None, 36108),
    ("25.11", "llama3-70b", "DGX-GB300", 64, "FP8-CS", 256, 2, 8192, 64, 1, 1, 1, None, None, 4520),
    ("25.11", "llama31-405b", "DGX-GB300", 256, "FP8-CS", 1536, 1, 8192, 0, 2, 8, 2, 4, None, 999),
    ("25.11", "deepseek-v3", "DGX-GB300", 256, "BF16", 4096, 1, 4096, 0, 1, 2, 1, 4, 32, 3848),
    ("25.11", "deepseek-v3", "DGX-GB300", 256, "FP8-MX", 4096, 1, 4096, 0, 1, 2, 1, 4, 32, 4357),
    ("25.11", "gpt-oss-120b", "DGX-GB300", 64, "BF16", 1280, 2, 8192, 0, 1, 1, 1, None, 64, 18347),
    ("25.11", "qwen3-30b-a3b", "DGX-GB300", 8, "FP8-MX", 512, 4, 4096, 0, 1, 1, 1, None, 8, 28934),
    ("25.11", "qwen3-235b-a22b", "DGX-GB300", 256, "BF16", 8192, 2, 4096, 0, 1, 4, 1, 12, 16, 6131),
]


def bridge_recipe(model: str, system: str, prec: str, task: str) -> dict:
    """What the table does not print, from the perf recipe at Megatron-Bridge commit BRIDGE_COMMIT
    (src/megatron/bridge/perf_recipes/<model>/<chip>/*.py; an older release's recipe may have differed)."""
    chip = system.split("-")[1].lower()
    mx = prec in ("MXFP8", "FP8-MX")
    r = dict(recompute="none", a2a=False, rnote="recompute_granularity None", tpo=None)
    if model == "deepseek-v3":
        mods = {("gb200", True): "mla_up_proj", ("gb200", False): "mla_up_proj" if prec == "BF16" else "mlp",
                ("b200", True): "mla_up_proj, mlp", ("gb300", True): "",
                ("gb300", False): "moe_act" if prec == "BF16" else "mla_up_proj"}.get((chip, mx), "mla_up_proj")
        r.update(recompute="selective" if mods else "none", modules=mods.split(", ") if mods else None,
                 rnote=f"recompute_granularity selective, recompute_modules [{mods}]",
                 a2a=mx)  # _enable_deepseek_full_iteration_mxfp8 (GB200, GB300, B300) / overlap_moe_expert_parallel_comm (B200)
    elif model == "gpt-oss-120b":
        if chip in ("gb200", "gb300") and mx:
            r.update(a2a=True, rnote="recompute_granularity selective with recompute_modules [] (nothing "
                     "recomputed), _apply_gpt_oss_120b_full_iter_fp8mx_configs: overlap_moe_expert_parallel_comm")
        elif chip in ("gb300", "b300"):
            r.update(rnote="recompute_granularity None (the recipe sets no recompute)")
        else:
            r.update(recompute="selective", modules=["layernorm", "moe_act"], a2a=chip == "gb200",
                     rnote="recompute_granularity selective, recompute_modules [layernorm, moe_act]")
    elif model.startswith("qwen3"):
        # recipes/qwen/<chip>/qwen3_moe.py and perf_recipes/qwen/<chip>/: expert_tensor_parallel_size = 1
        r.update(etp=1, rnote="recompute_granularity None, expert_tensor_parallel_size 1 (the Qwen3 MoE recipes)")
        r.update(a2a=(mx and chip in ("gb200", "b200", "gb300", "b300")) or (model == "qwen3-235b-a22b" and chip == "h100"))
    elif model == "llama3-8b" and chip == "h100":
        r.update(rnote="recompute full, block, 5 of 32 layers in the recipe at the commit (a partial recompute, "
                 "planned as none)")
    elif model == "llama3-70b" and chip == "gb200" and task == "pretrain" and not mx:
        r.update(rnote="Megatron-FSDP with CPU activation offloading of 40 layers (cpu_offloading_num_layers 40; "
                 "not in the profile)")
    if model.startswith("llama") and task == "sft":
        r.update(tpo=chip == "h100")  # comm_overlap tp_comm_overlap False on GB200 (tp 1), True on H100 (tp 4)
    return r


def bridge_row(row: tuple, fit: bool) -> dict:
    release, model, system, gpus, prec, gbs, mbs, seq, fsdp, tp, pp, cp, vp, ep, tok = row[:15]
    extra = row[15] if len(row) > 15 else {}
    task = extra.get("task", "pretrain")
    sysd = SYSTEMS[system]
    fp8, recipe = PRECISION[prec]
    rec = bridge_recipe(model, system, prec, task)
    chip = sysd["gpu"]
    pname = {"BF16": "bf16", "FP8": "fp8", "FP8-CS": "fp8", "MXFP8": "mxfp8", "FP8-MX": "mxfp8"}[prec]
    rel = release.replace(".", "")
    name = (f"bridge-{rel}-{model}-{chip.split('-')[0].lower()}-{pname}-{gpus}" + ("-sft" if task == "sft" else "")
            + (f"-{extra['suffix']}" if extra.get("suffix") else ""))
    fam_src = f"bridge-{release}" + ("-sft" if task == "sft" else "")
    family = f"{fam_src}/{chip.split('-')[0]}/{pname}"
    archive = "docs/performance-summary.md" if release == "26.08" else "docs/performance-summary-archive.md"
    section = "SFT" if task == "sft" else "Pre-Training"
    source = f"NVIDIA-NeMo/Megatron-Bridge {archive}, {release} NeMo Container, {section} Performance"
    figures = (f"{gpus} {system}, {prec}, GBS {gbs}, MBS {mbs}, seq {seq}, FSDP {fsdp}, TP {tp}, PP {pp}, CP {cp}, "
               f"VP {vp or 'n/a'}, EP {ep or 'n/a'}: {tok} tokens/s/GPU")
    return dict(name=name, family=family, source=source, figures=figures, model=model, system=system, gpus=gpus,
                fp8=fp8, recipe=recipe, gbs=gbs, mbs=mbs, seq=seq, fsdp=fsdp, tp=tp, pp=pp, cp=cp, vp=vp, ep=ep,
                tok=float(tok), rec=rec, task=task, note=extra.get("note"), fit=fit,
                framework="megatron", confidence="table verified (file read at commit " + BRIDGE_COMMIT[:7] + "); "
                "settings the table does not print from the recipe at that commit; MoE runs force-balanced and "
                "dropless (the source's footnote)")


# --- torchtitan (held out): benchmarks/*.md at commit TT_COMMIT; TPS/GPU as printed --------------------------------
TT_2412 = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
TT_ATP = "pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md"
TT_TRAINY = "pytorch/torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md"


def _tt(name, src, fam, model, system, gpus, seq, tp, pp, cp, local_batch, mbs, ac, prec, tok, figures, **kw):
    dp = gpus // (tp * pp * cp)
    return dict(name=name, family=fam, source=src, figures=figures, model=model, system=system, gpus=gpus,
                fp8=prec != "bf16", recipe={"bf16": None, "fp8": "tensorwise", "fp8-rowwise": "rowwise"}[prec],
                gbs=local_batch * dp, mbs=mbs, seq=seq, fsdp=dp * cp, tp=tp, pp=pp, cp=cp, vp=kw.get("vp"), ep=None,
                tok=float(tok), rec=dict(recompute=ac, a2a=False, rnote=kw.get("acnote", ""), tpo=kw.get("async_tp")),
                task="pretrain", note=kw.get("note"), fit=False, framework="fsdp2", grad="fp32",
                confidence=kw.get("confidence", "table verified (file read at commit " + TT_COMMIT[:7] + "); "
                                  "torch.compile is not in the profile"))


def torchtitan_rows() -> list[dict]:
    rows = []
    for gpus, table, comp, fp8 in ((8, 1, 6667, 8532), (128, 3, 6514, 8380)):
        for prec, tok, what in (("bf16", comp, "FSDP + torch.compile"), ("fp8", fp8, "FSDP + torch.compile + Float8")):
            rows.append(_tt(f"tt-2412-llama31-8b-h100-{prec}-compile-{gpus}", f"{TT_2412} Table {table}",
                            f"torchtitan-202412/H100/{prec}", "llama3-8b", "GT-H100-96", gpus, 8192, 1, 1, 1, 2, 2,
                            "op_selective", prec, tok, f"{gpus} H100 96GB 500 W, {what}, local batch 2, global "
                            f"{2 * gpus}, selective AC: {tok} TPS/GPU",
                            acnote="selective AC = torchtitan's op-level policy (selective_ac_option op)"))
    for fsdp, cp, seq, tok in ((8, 1, 32768, 3890), (4, 2, 65536, 2540), (2, 4, 131072, 1071), (1, 8, 262144, 548)):
        rows.append(_tt(f"tt-2412-llama31-8b-h100-fp8-cp{cp}-{seq // 1024}k", f"{TT_2412} Table 2",
                        "torchtitan-202412/H100/fp8", "llama3-8b", "GT-H100-96", 8, seq, 1, 1, cp, 1, 1, "full", "fp8",
                        tok, f"8 H100 96GB 500 W, FSDP {fsdp}, CP {cp}, seq {seq}, torch.compile + Float8, local batch "
                        f"1, full AC: {tok} TPS/GPU"))
    for name, tok, atp in (("2d", 829, False), ("2d-asynctp", 876, True)):
        rows.append(_tt(f"tt-2412-llama31-70b-h100-fp8-{name}-256", f"{TT_2412} Table 4", "torchtitan-202412/H100/fp8",
                        "llama3-70b", "GT-H100-96", 256, 8192, 8, 1, 1, 16, 16, "full", "fp8", tok,
                        f"256 H100 96GB 500 W, FSDP 32, TP 8{', AsyncTP' if atp else ''}, torch.compile + Float8, "
                        f"local batch 16, global 512, full AC: {tok} TPS/GPU", async_tp=atp))
    for sched, tok, vp in (("1f1b", 100, None), ("interleaved", 128, 2)):
        rows.append(_tt(f"tt-2412-llama31-405b-h100-fp8-{sched}-512", f"{TT_2412} Table 5", "torchtitan-202412/H100/fp8",
                        "llama31-405b", "GT-H100-96", 512, 8192, 8, 8, 1, 32, 1, "full", "fp8", tok,
                        f"512 H100 96GB 500 W, FSDP 8, TP 8, PP 8, {sched} schedule, torch.compile + Float8 + AsyncTP, "
                        f"local batch 32, global 256, full AC: {tok} TPS/GPU", async_tp=True, vp=vp,
                        note="micro-batch 1 (torchtitan's pipeline_parallel_microbatch_size default) and, for "
                             "Interleaved 1F1B, 2 stages per rank are guesses: the table does not state them"))
    for fsdp, cp, seq, tok in ((8, 1, 32768, 76), (4, 2, 65536, 47), (2, 4, 131072, 31), (1, 8, 262144, 16)):
        rows.append(_tt(f"tt-2412-llama31-405b-h100-fp8-cp{cp}-{seq // 1024}k", f"{TT_2412} Table 6",
                        "torchtitan-202412/H100/fp8", "llama31-405b", "GT-H100-96", 512, seq, 8, 8, cp, 8, 1, "full",
                        "fp8", tok, f"512 H100 96GB 500 W, TP 8, PP 8, FSDP {fsdp}, CP {cp}, seq {seq}, 1F1B, "
                        f"torch.compile + Float8 + AsyncTP, local batch 8, full AC: {tok} TPS/GPU", async_tp=True,
                        note="micro-batch 1 is a guess (torchtitan's default): the table does not state it"))
    for model, gpus, lb, ac, table in (("llama3-70b", 256, 16, "full", "Llama3 70b on 256 H100s"),
                                       ("llama3-8b", 64, 12, "op_selective", "Llama3 8b on 64 H100s")):
        size = model.split("-")[1]
        figs = {"llama3-70b": (("bf16", 597.3, 652.4), ("fp8", 809.8, 942.4), ("fp8-rowwise", 599.6, 624.8)),
                "llama3-8b": (("bf16", 4378, 4809.4), ("fp8", 5078.1, 5570.1), ("fp8-rowwise", 3708.5, 3914.9))}[model]
        for prec, vanilla, asyn in figs:
            for atp, tok in ((False, vanilla), (True, asyn)):
                rows.append(_tt(f"tt-2506-llama3-{size}-h100-{prec}-{'asynctp' if atp else 'tp'}-{gpus}",
                                f"{TT_ATP} table '{table}'", f"torchtitan-asynctp-202506/H100/{prec}", model,
                                "GT-H100-96", gpus, 8192, 8, 1, 1, lb, lb, ac, prec, tok,
                                f"{gpus} H100 96GB 500 W, FSDP {gpus // 8}, TP 8, torch.compile, {ac} AC, local batch "
                                f"{lb}, {prec}, {'async' if atp else 'vanilla'} TP: {tok} tokens/s per GPU",
                                async_tp=atp, note="sequence length 8192 from torchtitan's Llama 3 train configs "
                                "(the table does not state it)"))
    for nodes, tok in ((4, 10938), (8, 10753)):
        rows.append(_tt(f"tt-2506-trainy-llama31-8b-h200-fp8-{nodes * 8}", f"{TT_TRAINY} Results",
                        "torchtitan-trainy-202506/H200/fp8",
                        "llama3-8b", "H200-WF", nodes * 8, 8192, 1, 1, 1, 2, 2, "op_selective", "fp8", tok,
                        f"{nodes * 8} H200 ({nodes} hosts), FSDP, torch.compile, Float8 with fp8 all-gather, local "
                        f"batch 2, llama3_8b.toml (seq 8192, selective op AC): {tok} TPS/GPU",
                        confidence="table and command verified (file read at commit " + TT_COMMIT[:7] + "); seq and "
                        "AC from the llama3_8b.toml it names; torch.compile is not in the profile"))
    return rows


def deepseek_report_row() -> dict:
    """DeepSeek-V3 technical report (arXiv 2412.19437): 14.8T tokens in 2,664K H800 GPU hours of pre-training
    (Section 1 / Table 1; "180K H800 GPU hours per trillion tokens") on 2,048 H800: 14.8e12 / (2.664e6 x 3600)
    = 1,543 tokens/s per GPU. Layout (Section 3.2): PP 16, EP 64 over 8 nodes, ZeRO-1 data parallelism, no TP,
    DualPipe, FP8 with 1x128 / 128x128 blocks, fp8 dispatch, node-limited routing (4 nodes), RMSNorm and MLA
    up-projections recomputed; batch 15,360 sequences of 4,096 after a ramp from 3,072 (Section 4.2)."""
    tok = 14.8e12 / (2.664e6 * 3600)
    return dict(name="deepseek-v3-report-h800-2048", family="deepseek-v3-report/H800/fp8",
                source="DeepSeek-V3 Technical Report (arXiv 2412.19437) Sections 1, 3.2, 3.3, 4.2, Table 1",
                figures="2048 H800, pre-training of 14.8T tokens in 2,664K GPU hours (180K per trillion tokens): "
                        f"{tok:.1f} tokens/s per GPU; batch 15,360 x 4,096 (after a ramp from 3,072)",
                model="deepseek-v3", system="H800", gpus=2048, fp8=True, recipe="blockwise", gbs=15360, mbs=1,
                seq=4096, fsdp=0, tp=1, pp=16, cp=1, vp=None, ep=64, tok=tok, task="pretrain", fit=False,
                framework="megatron", grad="fp32",
                rec=dict(recompute="selective", modules=["layernorm", "mla_up_proj", "moe_act"], a2a=True,
                         rnote="RMSNorm and MLA up-projections recomputed in the backward (Section 3.2.3), the MoE "
                         "SwiGLU's output too (Section 3.3.3); activations cached in fp8 (Section 3.3.3)", tpo=None,
                         dispatch_fp8=True, node_limit=4, fp8_cache=True),
                note="DualPipe (two pipeline directions, two weight copies) is planned as 1F1B with the all-to-all "
                     "overlapped; the batch ramp and the MTP module (1 layer) are not in the profile; micro-batch 1 "
                     "is a guess (not stated)",
                confidence="report figures as recalled (the text was not read from a file here; 2,664K GPU hours "
                           "confirmed by third-party quotes); H800 planned as H100-SXM with NVLink 160 GB/s")


# --- Writing ------------------------------------------------------------------------------------------------------
def profile_of(r: dict) -> dict:
    """The plan profile of one row: the published layout in ``training:``, the machine in ``cluster:``."""
    sysd, spec = SYSTEMS[r["system"]], MODELS[r["model"]]
    gpus, tp, pp, cp = r["gpus"], r["tp"], r["pp"], r["cp"]
    dp = gpus // (tp * pp * cp)
    micro = r["gbs"] // (r["mbs"] * dp)
    if micro * r["mbs"] * dp != r["gbs"]:
        raise ValueError(f"{r['name']}: global batch {r['gbs']} is not micro-batch {r['mbs']} x dp {dp} x an integer")
    rec, moe = r["rec"], bool(spec["m"].get("experts"))
    cluster = dict(gpu=sysd["gpu"], gpus_per_node=sysd["gpn"], nodes=max(1, gpus // sysd["gpn"]))
    if r["system"] in ("DGX-GB200", "DGX-GB300"):
        cluster["nvlink_domain"] = 72 if gpus <= 72 else 64  # a 256-GPU job: 4 racks x 64 (64 EP ranks per domain)
    cluster.update(intra_node_GBps=sysd["intra"], inter_node_Gbps=sysd["inter"])
    if sysd.get("mem"):
        cluster["gpu_memory_GB"] = sysd["mem"]
    cluster.update(node_failure_per_day=0.0001, walltime_h=48)
    fsdp = r["framework"] == "fsdp2" or r["fsdp"] > 0
    t = dict(step_compute_s=round(r["gbs"] * r["seq"] / (gpus * r["tok"]), 4), step_serial_s=0,
             grad_dtype=r.get("grad", "bf16"), tp=tp, pp=pp, microbatches=micro, micro_batch_size=r["mbs"],
             zero_stage=3 if fsdp else 1, activation_recompute=rec["recompute"], sequence_parallel=tp > 1,
             framework="fsdp2" if fsdp else "megatron")
    t["tp_comm_overlap"] = rec["tpo"] if rec.get("tpo") is not None else tp > 1
    t.update(overlap_grad_reduce=True, overlap_param_gather=True,
             pipeline_schedule="interleaved" if r["vp"] and r["vp"] > 1 else "1f1b",
             interleave=r["vp"] if r["vp"] and r["vp"] > 1 else 1)
    if r["fp8"]:
        t.update(fp8=True, fp8_recipe=r["recipe"])
    if cp > 1:
        t["cp"] = cp
    if moe:
        t["ep"] = r["ep"] or 1
        if tp == 1 or rec.get("etp") == 1:
            t["etp"] = 1
        t["moe_a2a_overlap"] = bool(rec["a2a"])
    if rec["recompute"] == "selective" and rec.get("modules") is not None:
        t["recompute_modules"] = list(rec["modules"])
        if rec.get("dispatch_fp8"):
            t["moe_dispatch_fp8"] = True
        if rec.get("node_limit"):
            t["moe_node_limit"] = rec["node_limit"]
    if rec.get("fp8_cache"):
        t["fp8_activation_cache"] = True
    t.update(checkpoint_write_s=60, checkpoint_interval_s=10800, run_days=30)
    model = dict(spec["m"])
    model.update(seq_len=r["seq"], attention="flash", mlp="swiglu", dropout=0.0)
    order = ["params", "layers", "hidden", "seq_len", "heads", "kv_heads", "ffn_hidden", "vocab", "attention", "mlp",
             "dropout", "experts", "top_k", "shared_experts", "expert_ffn_hidden", "moe_layers", "qk_head_dim",
             "v_head_dim", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim"]
    model = {k: model[k] for k in order if k in model}
    return dict(project=r["name"], notes=f"{r['source']}. {r['figures']}.", model=model, cluster=cluster, training=t,
                data=dict(files=1000, mean_file_kB=256000, length_sigma=0), measure=False)


def header(r: dict, prof: dict, refused: str | None) -> str:
    sysd, spec, t = SYSTEMS[r["system"]], MODELS[r["model"]], prof["training"]
    kind = "calibration set" if r["fit"] else "held-out evaluation set: never fit on it"
    lines = [f"Published-run profile for `preflight advise` ({kind}) ({r['name']}).",
             f"Family: {r['family']}.",
             f"Source: {r['source']}.",
             f"Published: {r['figures']}.",
             f"Published tokens/s per GPU (measured throughput, independent of FLOP conventions): {r['tok']:.6g}.",
             f"Model shape: {spec['src']}.",
             f"Machine: {sysd['note']}.",
             f"Not printed by the table, from the recipe: {r['rec']['rnote'] or 'none'}; all-to-all overlap "
             f"{bool(r['rec']['a2a'])}; tp_comm_overlap {t.get('tp_comm_overlap')}.",
             f"Confidence: {r['confidence']}.",
             "step_compute_s is the published step (global batch x sequence / GPUs / tokens/s per GPU), as in "
             "data/profiles/published/."]
    if r["fsdp"] and r["framework"] == "megatron":
        lines.append(f"FSDP {r['fsdp']} in the table: Megatron-FSDP (optim_grads_params), planned as fsdp2 zero_stage 3.")
    if r["task"] == "sft":
        lines.append("Supervised fine-tuning (Megatron-Bridge's SFT recipe, packed sequences): its own family.")
    if r.get("note"):
        lines.append(f"Note: {r['note']}.")
    if refused:
        lines.append(f"REFUSED by the profile today (kept in pending/, not loaded): {refused}")
    out = []
    for line in lines:
        words, cur = line.split(), ""
        for w in words:
            if len(cur) + len(w) + 1 > 116:
                out.append(cur)
                cur = "  " + w
            else:
                cur = f"{cur} {w}" if cur else w
        out.append(cur)
    return "".join(f"# {x}\n" for x in out)


def summary_of(r: dict) -> dict:
    """One row of bridge.yaml / heldout.yaml, in published.yaml's format plus family, chip and gpus."""
    zero = 3 if (r["fsdp"] or r["framework"] == "fsdp2") else 1
    layout = dict(cp=r["cp"], ep=r["ep"], fp8=r["recipe"] if r["fp8"] else None, fsdp=r["fsdp"], mbs=r["mbs"], pp=r["pp"],
                  recompute=r["rec"]["recompute"], sp=r["tp"] > 1, tp=r["tp"], v=r["vp"], zero=zero)
    return dict(confidence=r["confidence"], family=r["family"], figures=r["figures"], gbs=r["gbs"], gpus=r["gpus"],
                chip=r["system"], layout=layout,
                metric=f"{r['tok']:.6g} tok/s/GPU", pub_tok_s_gpu=r["tok"], source=r["source"], task=r["task"])


def write(rows: list[dict], folder: Path, index: str) -> tuple[int, list[str]]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pending").mkdir(exist_ok=True)
    for old in list(folder.glob("*.yaml")) + list((folder / "pending").glob("*.yaml")):
        old.unlink()
    names = [r["name"] for r in rows]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"duplicate row names: {sorted(dup)}")
    summary, pending = {}, {}
    for r in rows:
        prof = profile_of(r)
        try:
            Profile.model_validate(prof)
            refused = None
        except ValueError as e:
            refused = " ".join(str(e).split())[:400]
        text = header(r, prof, refused) + yaml.safe_dump(prof, sort_keys=False, width=110)
        target = folder / "pending" if refused else folder
        (target / f"{r['name']}.yaml").write_text(text)
        (pending if refused else summary)[r["name"]] = summary_of(r) | ({"refused": refused} if refused else {})
    (folder / index).write_text(yaml.safe_dump(summary, sort_keys=True, width=110))
    (folder / "pending" / index).write_text(yaml.safe_dump(pending, sort_keys=True, width=110))
    return len(summary), sorted(pending)


def main() -> int:
    fit = [bridge_row(row, True) for row in FIT]
    held = [bridge_row(row, False) for row in HELDOUT_BRIDGE] + torchtitan_rows() + [deepseek_report_row()]
    for rows, folder, index in ((fit, "bridge", "bridge.yaml"), (held, "heldout", "heldout.yaml")):
        n, pending = write(rows, ROOT / "data" / "profiles" / folder, index)
        fams: dict[str, int] = {}
        for r in rows:
            if r["name"] not in pending:
                fams[r["family"]] = fams.get(r["family"], 0) + 1
        print(f"{folder}: {n} profiles, {len(pending)} pending")
        for f, k in sorted(fams.items()):
            print(f"  {f}: {k}")
        for p in pending:
            print(f"  pending: {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
