"""The chip table: driver names as real machines report them, and each row against its datasheet."""
import pytest

from preflight.core import hardware
from preflight.models import flops

# (name the driver reports, table key). Each is a string a real machine printed: nvidia-smi,
# torch.cuda.get_device_name or the CUDA driver API.
DRIVER_NAMES = [
    ("NVIDIA GH200 480GB", "GH200"),              # 96 GB HBM3 (480 GB is the Grace LPDDR5X)
    ("NVIDIA GH200 144G HBM3e", "GH200-144GB"),
    ("NVIDIA GB200", "GB200"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-SXM-40GB"),
    ("NVIDIA A100 80GB PCIe", "A100-PCIe"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA H100 PCIe", "H100-PCIe"),
    ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA H200", "H200-SXM"),
    ("NVIDIA H200 NVL", "H200-NVL"),
    ("NVIDIA L40S", "L40S"),
    ("AMD Instinct MI300X", "MI300X"),
]


@pytest.mark.parametrize("driver_name, key", DRIVER_NAMES)
def test_driver_names_resolve_to_their_row(driver_name, key):
    assert hardware.lookup(driver_name).name == key
    assert hardware.lookup(key).name == key              # table keys resolve to themselves


def test_superchips_are_not_taken_for_their_neighbours():
    # the bug this table had: "GH200" contains "H200", "GB200" contains "B200"
    assert hardware.lookup("NVIDIA GH200 480GB").memory_GBps == 4000.0      # not H200's 4,800
    assert hardware.lookup("NVIDIA GB200").bf16_tflops == 2500.0            # not B200's 2,250
    assert hardware.lookup("NVIDIA A100-PCIE-40GB").memory_GB == 40.0       # not the 80 GB PCIe


@pytest.mark.parametrize("name", ["NVIDIA L40", "NVIDIA GeForce RTX 4090", "Intel(R) Xeon(R) CPU", "", None])
def test_unknown_chips_have_no_peak_and_no_mfu(name):
    assert hardware.lookup(name) is None
    assert hardware.peak_tflops(name) is None
    assert flops.mfu(400e12, hardware.peak_tflops(name)) is None


def test_unknown_dtype_has_no_peak():
    assert hardware.peak_tflops("NVIDIA H100 80GB HBM3", "int4") is None
    assert hardware.peak_tflops("NVIDIA H100 80GB HBM3", "fp32") == 67.0


def test_fp8_peaks_are_the_datasheets_dense_figures():
    # half of the "*" sparse figure: H100 SXM 3,958* -> 1,979; B200 9 PFLOPS* -> 4,500; A100 has no FP8
    assert hardware.peak_tflops("NVIDIA H100 80GB HBM3", "fp8") == 1979.0
    assert hardware.peak_tflops("B200", "fp8") == 4500.0 and hardware.peak_tflops("A100-SXM", "fp8") is None
    assert all(c.fp8_tflops is None or c.fp8_tflops >= 1.9 * c.bf16_tflops for c in hardware.CHIPS.values())


@pytest.mark.parametrize("key, bf16, fp32, tf32, GBps, GB", [
    # the figures each row's source prints (dense = half the starred sparse figure)
    ("A100-SXM", 312.0, 19.5, 156.0, 2039.0, 80.0),
    ("A100-PCIe-40GB", 312.0, 19.5, 156.0, 1555.0, 40.0),
    ("H100-SXM", 1979 / 2, 67.0, 989 / 2, 3350.0, 80.0),
    ("H100-NVL", 1671 / 2, 60.0, 835 / 2, 3900.0, 94.0),
    ("H200-SXM", 1979 / 2, 67.0, 989 / 2, 4800.0, 141.0),
    ("GH200", 990.0, 67.0, 494.0, 4000.0, 96.0),
    ("GH200-144GB", 990.0, 67.0, 494.0, 4900.0, 144.0),
    ("B200", 4500 / 2, 75.0, 2200 / 2, 7700.0, 180.0),
    ("GB200", 5000 / 2, 80.0, 2500 / 2, 8000.0, 186.0),
])
def test_rows_match_their_datasheet(key, bf16, fp32, tf32, GBps, GB):
    c = hardware.CHIPS[key]
    assert (c.bf16_tflops, c.fp16_tflops, c.fp32_tflops, c.tf32_tflops) == pytest.approx((bf16, bf16, fp32, tf32))
    assert (c.memory_GBps, c.memory_GB) == (GBps, GB)


def test_every_row_cites_its_source_and_is_consistent():
    for c in hardware.CHIPS.values():
        assert c.source and ("datasheet" in c.source or "product page" in c.source), c.name
        assert c.bf16_tflops > c.tf32_tflops > c.fp32_tflops > 0, c.name
        assert c.memory_GBps > 0 and c.memory_GB > 0, c.name
    nvidia = [c for c in hardware.CHIPS.values() if c.name != "MI300X"]
    assert all("https://" in c.source for c in nvidia)
