"""The one table of hardware peaks, and the one home of link constants.

Peaks are *dense* (no structured sparsity) tensor-core rates from the vendors' datasheets. MFU uses
them as the denominator; when the chip is not in the table the peak is ``None`` and MFU is reported as
"unknown peak" rather than guessed. A measured matmul ceiling (``preflight.bench.ceilings``) is the
better denominator in practice: it is what this chip, driver and library really deliver.

No torch import: the plan-only audit and the sliders use this table too.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Chip:
    name: str
    bf16_tflops: float      # dense tensor-core BF16, TFLOP/s
    fp16_tflops: float      # dense tensor-core FP16, TFLOP/s
    fp32_tflops: float      # plain FP32 (non-tensor-core), TFLOP/s
    tf32_tflops: float | None  # dense TF32 tensor-core, TFLOP/s (None where the chip has no TF32)
    memory_GBps: float      # device memory bandwidth, GB/s
    memory_GB: float        # device memory as marketed ("80GB" is 80 GiB of HBM; torch reports bytes)
    nvlink_GBps: float | None  # per-GPU scale-up link bandwidth, GB/s, both directions summed
    source: str

    def peak_tflops(self, dtype: str) -> float | None:
        return {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp32": self.fp32_tflops,
                "tf32": self.tf32_tflops}.get(dtype)

    def as_dict(self) -> dict:
        return asdict(self)


CHIPS: dict[str, Chip] = {c.name: c for c in [
    Chip("A100-SXM", 312.0, 312.0, 19.5, 156.0, 2039.0, 80.0, 600.0,
         "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM)"),
    Chip("A100-SXM-40GB", 312.0, 312.0, 19.5, 156.0, 1555.0, 40.0, 600.0,
         "NVIDIA A100 Tensor Core GPU datasheet (40GB SXM)"),
    Chip("A100-PCIe", 312.0, 312.0, 19.5, 156.0, 1935.0, 80.0, 600.0,
         "NVIDIA A100 Tensor Core GPU datasheet (80GB PCIe, NVLink bridge)"),
    Chip("H100-SXM", 989.4, 989.4, 66.9, 494.7, 3350.0, 80.0, 900.0,
         "NVIDIA H100 Tensor Core GPU datasheet (SXM5; dense = half the sparse figure)"),
    Chip("H100-PCIe", 756.5, 756.5, 51.2, 378.0, 2000.0, 80.0, 600.0,
         "NVIDIA H100 Tensor Core GPU datasheet (PCIe)"),
    Chip("H100-NVL", 835.5, 835.5, 60.0, 417.5, 3900.0, 94.0, 600.0,
         "NVIDIA H100 NVL datasheet (per GPU; NVLink bridge 600 GB/s)"),
    Chip("H200-NVL", 835.5, 835.5, 60.0, 417.5, 4800.0, 141.0, 900.0,
         "NVIDIA H200 NVL datasheet (per GPU; 2- or 4-way NVLink bridge)"),
    Chip("H200-SXM", 989.4, 989.4, 66.9, 494.7, 4800.0, 141.0, 900.0,
         "NVIDIA H200 Tensor Core GPU datasheet (SXM; same compute as H100 SXM)"),
    Chip("B200", 2250.0, 2250.0, 75.0, 1125.0, 8000.0, 180.0, 1800.0,
         "NVIDIA HGX B200 datasheet (per GPU = HGX figure / 8, dense = half the sparse figure)"),
    Chip("L40S", 362.05, 362.05, 91.6, 183.0, 864.0, 48.0, None,
         "NVIDIA L40S datasheet (no NVLink; PCIe Gen4 x16)"),
    Chip("MI300X", 1307.4, 1307.4, 163.4, 653.7, 5300.0, 192.0, 896.0,
         "AMD Instinct MI300X datasheet (Infinity Fabric: 7 links x 128 GB/s)"),
]}

# Device names as drivers report them -> table key. First match wins; order from specific to general.
_NAME_PATTERNS = [
    (r"H200.*NVL", "H200-NVL"),
    (r"H200", "H200-SXM"),
    (r"H100.*NVL", "H100-NVL"),
    (r"H100.*PCIe", "H100-PCIe"),
    (r"H100", "H100-SXM"),
    (r"A100.*PCIe", "A100-PCIe"),
    (r"A100.*40GB", "A100-SXM-40GB"),
    (r"A100", "A100-SXM"),
    (r"B200", "B200"),
    (r"L40S", "L40S"),
    (r"MI300X", "MI300X"),
]

# Per-message latency (alpha) of the communication model, seconds. Typical NCCL small-message
# latencies: a few microseconds over NVLink, ~10 us across an InfiniBand/RoCE fabric.
INTRA_NODE_LATENCY_S = 5e-6
INTER_NODE_LATENCY_S = 10e-6

# Named interconnect tiers for the AllReduce calculator: per-GPU bandwidth, GB/s (bytes). Network links
# are quoted in Gb/s (bits) and divided by 8 here; a NIC shared by a node's 8 GPUs gives each an eighth.
LINK_TIERS_GBps = {
    "NVLink 4 (H100, 450 GB/s per direction)": 450.0,
    "NVLink 3 (A100, 300 GB/s)": 300.0,
    "InfiniBand NDR 400 Gb/s per GPU": 400 / 8,
    "InfiniBand HDR 200 Gb/s per GPU": 200 / 8,
    "100 GbE per GPU": 100 / 8,
    "25 GbE per node shared by 8 GPUs": 25 / 8 / 8,
}


def lookup(name: str | None) -> Chip | None:
    """Table entry for a table key or a driver-reported device name; None when unknown."""
    if not name:
        return None
    if name in CHIPS:
        return CHIPS[name]
    for pattern, key in _NAME_PATTERNS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return CHIPS[key]
    return None


def peak_tflops(name: str | None, dtype: str = "bf16") -> float | None:
    """Dense peak TFLOP/s of a chip for a dtype, or None if the chip (or dtype) is unknown."""
    chip = lookup(name)
    return chip.peak_tflops(dtype) if chip else None


def table():
    """The table as a pandas DataFrame (imported lazily: this module stays import-light)."""
    import pandas as pd

    return pd.DataFrame([c.as_dict() for c in CHIPS.values()]).set_index("name")
