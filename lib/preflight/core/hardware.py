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
    memory_GB: float        # device memory as marketed, GB (decimal: the planner reads it as 1e9 bytes)
    nvlink_GBps: float | None  # per-GPU scale-up link bandwidth, GB/s, both directions summed
    source: str
    fp8_tflops: float | None = None  # dense FP8 tensor-core, TFLOP/s (None: no FP8 tensor cores)
    smi_MiB: int | None = None       # total memory nvidia-smi reports, MiB (None: not recorded here)

    @property
    def capacity_bytes(self) -> float:
        """What the memory planner holds a plan against: nvidia-smi's total where recorded (an H100 "80GB"
        shows 81,559 MiB = 85.5e9 B: less than 80 GiB = 85.9e9), else the marketed GB as 1e9 bytes (below
        every recorded total, so on the safe side)."""
        return self.smi_MiB * 2 ** 20 if self.smi_MiB else self.memory_GB * 1e9

    def peak_tflops(self, dtype: str) -> float | None:
        return {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp32": self.fp32_tflops,
                "tf32": self.tf32_tflops, "fp8": self.fp8_tflops}.get(dtype)

    def as_dict(self) -> dict:
        return asdict(self)


# nvidia-smi's total memory (``smi_MiB``), as reported on these parts: A100-SXM4-80GB 81,920 MiB, A100-SXM4-40GB
# 40,960 MiB, H100 80GB HBM3 81,559 MiB, H200 143,771 MiB. The other rows use the marketed GB as 1e9 bytes.
# FP8 (``fp8_tflops``): the same datasheets' FP8 tensor-core rows, dense (half the "*" sparse figure):
# H100 SXM / H200 SXM / GH200 3,958* -> 1,979; H100 PCIe 3,026* -> 1,513; H100 / H200 NVL 3,341* -> 1,670.5;
# B200 9 PFLOPS* -> 4,500; GB200 10 PFLOPS* -> 5,000; L40S 1,466* -> 733; MI300X 2,614.9 dense. A100 has none.
# MFU stays stated against the bf16 peak even for fp8 runs (the common convention: the FP8 peak would halve
# the figure and hide that the same model now runs faster; say which peak when comparing).
# Datasheets, one home each (a row's ``source`` names the column it was read from). "*" figures on NVIDIA
# datasheets are with 2:4 structured sparsity; the dense rate stored here is half of them, or the dense
# figure itself where the datasheet prints one (GH200, L40S).
_A100 = ("https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_GH200 = "https://nvdam.widen.net/s/rrgqqnpbz8/grace-datasheet-gh200-grace-hopper-superchip-3773000"
_BLACKWELL = "https://nvdam.widen.net/s/wwnsxrhm2w/blackwell-datasheet-3384703"
_L40S = "https://www.nvidia.com/en-us/data-center/l40s/"

CHIPS: dict[str, Chip] = {c.name: c for c in [
    Chip("A100-SXM", 312.0, 312.0, 19.5, 156.0, 2039.0, 80.0, 600.0,
         f"NVIDIA A100 datasheet, A100 80GB SXM: BF16/FP16 312 | 624*, TF32 156 | 312*, FP32 19.5, "
         f"2,039 GB/s, NVLink 600 GB/s ({_A100})", smi_MiB=81920),
    Chip("A100-SXM-40GB", 312.0, 312.0, 19.5, 156.0, 1555.0, 40.0, 600.0,
         f"NVIDIA A100 datasheet, A100 40GB SXM: compute as the 80GB SXM, 1,555 GB/s ({_A100})", smi_MiB=40960),
    Chip("A100-PCIe", 312.0, 312.0, 19.5, 156.0, 1935.0, 80.0, 600.0,
         f"NVIDIA A100 datasheet, A100 80GB PCIe: compute as SXM, 1,935 GB/s, NVLink bridge for 2 GPUs "
         f"600 GB/s ({_A100})"),
    Chip("A100-PCIe-40GB", 312.0, 312.0, 19.5, 156.0, 1555.0, 40.0, 600.0,
         f"NVIDIA A100 datasheet, A100 40GB PCIe: compute as SXM, 1,555 GB/s, NVLink bridge for 2 GPUs "
         f"600 GB/s ({_A100})"),
    Chip("H100-SXM", 989.5, 989.5, 67.0, 494.5, 3350.0, 80.0, 900.0,
         f"NVIDIA H100 datasheet, H100 SXM: BF16/FP16 1,979*, TF32 989*, FP32 67, 80 GB, 3.35 TB/s, "
         f"NVLink 900 GB/s ({_H100})", fp8_tflops=1979.0, smi_MiB=81559),
    Chip("H100-PCIe", 756.5, 756.5, 51.0, 378.0, 2000.0, 80.0, 600.0,
         f"NVIDIA H100 datasheet, earlier revision's H100 PCIe column: BF16/FP16 1,513*, TF32 756*, FP32 51, "
         f"80 GB HBM2e, 2 TB/s, NVLink bridge 600 GB/s (the current revision lists H100 NVL instead; {_H100})",
         fp8_tflops=1513.0),
    Chip("H100-NVL", 835.5, 835.5, 60.0, 417.5, 3900.0, 94.0, 600.0,
         f"NVIDIA H100 datasheet, H100 NVL (per GPU): BF16/FP16 1,671*, TF32 835*, FP32 60, 94 GB, 3.9 TB/s, "
         f"NVLink 600 GB/s ({_H100})", fp8_tflops=1670.5),
    Chip("H200-NVL", 835.5, 835.5, 60.0, 417.5, 4800.0, 141.0, 900.0,
         f"NVIDIA H200 product page, H200 NVL: BF16/FP16 1,671*, TF32 835*, FP32 60, 141 GB, 4.8 TB/s, "
         f"2- or 4-way NVLink bridge 900 GB/s per GPU ({_H200}; a copy of the H200 datasheet PDF is "
         "reported to print 4.2 TB/s for the NVL: measure it)", fp8_tflops=1670.5),
    Chip("H200-SXM", 989.5, 989.5, 67.0, 494.5, 4800.0, 141.0, 900.0,
         f"NVIDIA H200 product page, H200 SXM: BF16/FP16 1,979*, TF32 989*, FP32 67, 141 GB, 4.8 TB/s, "
         f"NVLink 900 GB/s ({_H200})", fp8_tflops=1979.0, smi_MiB=143771),
    Chip("GH200", 990.0, 990.0, 67.0, 494.0, 4000.0, 96.0, None,
         f"NVIDIA GH200 Grace Hopper Superchip datasheet, GH200 (96GB HBM3): BF16/FP16 990 dense, TF32 494 "
         f"dense, FP32 67, up to 4 TB/s; NVLink-C2C 900 GB/s is CPU-GPU, GPU-GPU NVLink depends on the "
         f"system ({_GH200})", fp8_tflops=1979.0),
    Chip("GH200-144GB", 990.0, 990.0, 67.0, 494.0, 4900.0, 144.0, None,
         f"NVIDIA GH200 Grace Hopper Superchip datasheet, GH200 (144GB HBM3e): compute as the 96GB part, "
         f"up to 4.9 TB/s ({_GH200})", fp8_tflops=1979.0),
    Chip("B200", 2250.0, 2250.0, 75.0, 1100.0, 7700.0, 180.0, 1800.0,
         f"NVIDIA Blackwell datasheet, HGX B200 per GPU: BF16/FP16 4.5 PFLOPS*, TF32 2.2 PFLOPS*, FP32 75, "
         f"180 GB HBM3E, 7.7 TB/s, NVLink 1.8 TB/s ({_BLACKWELL})", fp8_tflops=4500.0),
    Chip("GB200", 2500.0, 2500.0, 80.0, 1250.0, 8000.0, 186.0, 1800.0,
         f"NVIDIA Blackwell datasheet, GB200 NVL72 per GPU: BF16/FP16 5 PFLOPS*, TF32 2.5 PFLOPS*, FP32 80, "
         f"186 GB HBM3E, 8 TB/s, NVLink 1.8 TB/s ({_BLACKWELL})", fp8_tflops=5000.0),
    # Blackwell Ultra: the FP8 / BF16 tensor rates of B200 / GB200 with 288 GB of HBM3E (the gain is in FP4);
    # NVIDIA lists them with sparsity (DGX B300: 72 PF FP8 for 8 GPUs; GB300 NVL72: 720 PF FP8, 360 PF
    # FP16/BF16 for 72 GPUs): halved here for the dense rates. Not checked against a datasheet PDF here.
    Chip("B300", 2250.0, 2250.0, 75.0, 1100.0, 8000.0, 288.0, 1800.0,
         "NVIDIA DGX B300 product page, per GPU: FP8 4.5 PFLOPS and BF16 2.25 PFLOPS dense (the listed sparse "
         "figures halved), 288 GB HBM3E, 8 TB/s, NVLink 1.8 TB/s (TF32 and FP32 as B200: not re-checked; "
         "https://www.nvidia.com/en-us/data-center/dgx-b300/)",
         fp8_tflops=4500.0),
    Chip("GB300", 2500.0, 2500.0, 80.0, 1250.0, 8000.0, 288.0, 1800.0,
         "NVIDIA GB300 NVL72 product page, per GPU (rack figures / 72, sparse halved): FP8 5 PFLOPS, FP16/BF16 "
         "2.5 PFLOPS dense, 288 GB HBM3E, 8 TB/s, NVLink 1.8 TB/s in a 72-GPU NVLink domain (TF32 and FP32 as "
         "GB200: not re-checked; https://www.nvidia.com/en-us/data-center/gb300-nvl72/)", fp8_tflops=5000.0),
    Chip("L40S", 362.05, 362.05, 91.6, 183.0, 864.0, 48.0, None,
         f"NVIDIA L40S product page: BF16/FP16 362.05 | 733*, 48 GB GDDR6, 864 GB/s, no NVLink ({_L40S}; "
         "TF32 183 and FP32 91.6 not re-checked)", fp8_tflops=733.0),
    Chip("MI300X", 1307.4, 1307.4, 163.4, 653.7, 5300.0, 192.0, 896.0,
         "AMD Instinct MI300X datasheet: FP16/BF16 1,307.4 dense, 192 GB HBM3, 5.3 TB/s, Infinity Fabric "
         "7 links x 128 GB/s (FP32 163.4 and TF32 653.7 not re-checked)", fp8_tflops=2614.9),
]}

# Device names as drivers report them -> table key. First match wins, so the order runs from specific to
# general; ``\b`` keeps "H200" from matching "GH200" and "B200" from matching "GB200". Real names:
# "NVIDIA GH200 480GB" (96 GB HBM3; 480 GB is the Grace LPDDR5X), "NVIDIA GH200 144G HBM3e",
# "NVIDIA GB200", "NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe".
_NAME_PATTERNS = [
    (r"\bGH200\b.*(144G|HBM3e)", "GH200-144GB"),
    (r"\bGH200\b", "GH200"),
    (r"\bGB300\b", "GB300"),
    (r"\bGB200\b", "GB200"),
    (r"\bH200\b.*NVL", "H200-NVL"),
    (r"\bH200\b", "H200-SXM"),
    (r"\bH100\b.*NVL", "H100-NVL"),
    (r"\bH100\b.*PCIe", "H100-PCIe"),
    (r"\bH100\b", "H100-SXM"),
    (r"\bA100\b(?=.*PCIe)(?=.*40GB)", "A100-PCIe-40GB"),
    (r"\bA100\b.*PCIe", "A100-PCIe"),
    (r"\bA100\b.*40GB", "A100-SXM-40GB"),
    (r"\bA100\b", "A100-SXM"),
    (r"\bB300\b", "B300"),
    (r"\bB200\b", "B200"),
    (r"\bL40S\b", "L40S"),
    (r"\bMI300X\b", "MI300X"),
]

# Per-message latency (alpha) of the communication model, seconds. Typical NCCL small-message
# latencies: a few microseconds over NVLink, ~10 us across an InfiniBand/RoCE fabric.
INTRA_NODE_LATENCY_S = 5e-6
INTER_NODE_LATENCY_S = 10e-6

# Named interconnect tiers for the AllReduce calculator: the bandwidth of one inter-node NIC, GB/s (bytes;
# networks are quoted in Gb/s, bits, divided by 8 here). How many NICs a node has is the plan's
# ``cluster.nics_per_node`` (one per GPU on rail-optimised HGX/DGX nodes; 1 = one shared by the node).
LINK_TIERS_GBps = {
    "InfiniBand NDR 400 Gb/s per NIC": 400 / 8,
    "InfiniBand HDR 200 Gb/s per NIC": 200 / 8,
    "100 GbE per NIC": 100 / 8,
    "25 GbE per NIC": 25 / 8,
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


def fp32_compute_dtype(matmul_precision: str = "highest", conv_tf32: bool = False,
                       has_conv: bool = False) -> str:
    """The tensor-core precision an fp32 workload really runs its matmuls / convolutions in on an
    NVIDIA GPU, hence the peak its MFU must be stated against (``Chip.peak_tflops`` of the answer).

    - ``torch.set_float32_matmul_precision``: ``"highest"`` keeps plain fp32 (CUDA cores);
      ``"high"`` lets matmuls use TF32 tensor cores; ``"medium"`` lets them use bf16 internally where
      a kernel exists (else TF32): its peak is the bf16 one, the largest a matmul may then reach.
    - cuDNN convolutions: ``torch.backends.cudnn.allow_tf32`` is True by default, so an fp32 CNN runs
      its convolutions in TF32 unless it is switched off (``conv_tf32``, ``has_conv``).

    Against the CUDA-core fp32 peak such a run would read up to ~7x too high an MFU (H100 SXM: TF32
    494.5 vs FP32 67 TFLOP/s) and pass; against the peak of the precision allowed it reads true.
    """
    if matmul_precision == "medium":
        return "bf16"
    if matmul_precision == "high" or (conv_tf32 and has_conv):
        return "tf32"
    return "fp32"


def table():
    """The table as a pandas DataFrame (imported lazily: this module stays import-light)."""
    import pandas as pd

    return pd.DataFrame([c.as_dict() for c in CHIPS.values()]).set_index("name")
