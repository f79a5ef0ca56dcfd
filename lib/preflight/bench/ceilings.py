"""Measured ceilings of this machine: what the chip, driver and libraries really deliver.

A datasheet peak is a promise made for ideal conditions; the ceilings here are what a plain,
well-shaped operation achieves on *this* machine, today. They are the honest denominators:

- ``matmul_rate``        large square matmul, TFLOP/s (compute ceiling; the MFU denominator);
- ``memcopy_bandwidth``  device-memory copy, GB/s (the ceiling every memory-bound op runs into);
- ``h2d_bandwidth``      host-to-device copy, GB/s, pageable vs pinned host memory (the data path).

Every figure is the median of repeats after a warm-up, timed with ``preflight.core.timing.time_fn``
(CUDA events on a GPU). Run alone::

    python -m preflight.bench.ceilings --out results/ [--quick]

Under ``torchrun`` or ``srun`` each rank measures its own device (``LOCAL_RANK`` / ``SLURM_LOCALID``)
and writes its own record, ``ceilings-rank<RANK>.json``: one slow GPU in a node shows up here.
"""
from __future__ import annotations

import argparse
import os
import sys

from preflight.core import hardware
from preflight.core.device import default_device, device_name, launch_rank, local_rank, on_device, torch_fp32_precision
from preflight.core.records import Method
from preflight.core.timing import time_fn

METHOD = Method("ceilings", 1, required=("matmul.tflops", "matmul.dtype", "matmul.n", "memcopy.GBps", "h2d"))

# torch is imported in the functions that measure, not here: a plan-only audit reads METHOD without
# loading torch (about 1 s; tests/test_audit.py checks that it never does).
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}   # name -> torch attr


def _dtype_name(dtype) -> str:
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; accepted: {', '.join(_DTYPES)}")
        return dtype
    import torch

    for name, attr in _DTYPES.items():
        if getattr(torch, attr) == dtype:
            return name
    raise ValueError(f"unsupported dtype {dtype}")


# ------------------------------------------------------------------------------------ measurements
def matmul_rate(device, dtype=None, n: int | None = None) -> dict:
    """Achieved TFLOP/s of an ``n x n`` by ``n x n`` matmul (``2 n^3`` FLOPs), median of repeats.

    Defaults: bf16 and n=8192 on a GPU (tensor cores, large enough to reach the plateau), fp32 and
    n=1024 on the CPU (a few tens of ms per call on two cores). The result also carries the
    datasheet peak for the chip and dtype (None when unknown) and the fraction of it reached.
    """
    import torch

    dev = torch.device(device)
    gpu = dev.type == "cuda"
    name = _dtype_name(dtype if dtype is not None else ("bf16" if gpu else "fp32"))
    dt = getattr(torch, _DTYPES[name])
    n = int(n or (8192 if gpu else 1024))
    with on_device(dev):
        a = torch.randn(n, n, device=dev, dtype=dt)
        b = torch.randn(n, n, device=dev, dtype=dt)
        c = torch.empty(n, n, device=dev, dtype=dt)
        t = time_fn(lambda: torch.matmul(a, b, out=c), device=dev, warmup=5 if gpu else 1,
                    repeats=20 if gpu else 5, min_time_s=0.5 if gpu else 0.2)
        a = b = c = None               # free the device memory now (not del: the lambda holds the names)
    flop = 2.0 * n ** 3
    # fp32 on a GPU may use TF32 (or bf16) tensor cores: say which precision was allowed, and take
    # the datasheet peak of that precision (hardware.fp32_compute_dtype, device.torch_fp32_precision).
    precision = torch_fp32_precision() if name == "fp32" else None
    peak_dtype = precision["peak_dtype"] if precision else name
    peak = hardware.peak_tflops(device_name(dev), peak_dtype) if gpu else None
    tflops = flop / t.median_s / 1e12
    return {
        "device": str(dev), "dtype": name, "n": n, "flop": flop, **t.as_dict(),
        "tflops": tflops,
        "fp32_matmul_precision": precision["float32_matmul_precision"] if precision else None,
        "precision": precision, "peak_dtype": peak_dtype,
        "datasheet_peak_tflops": peak,
        "fraction_of_peak": tflops / peak if peak else None,
    }


def memcopy_bandwidth(device, mbytes: float | None = None) -> dict:
    """Device-memory copy bandwidth, GB/s = ``2 * size / time`` (each byte is read once and written
    once). GPU: a 1 GB buffer by default. CPU: a host tensor copy of 512 MB, so that source plus
    destination (1 GB) exceed this machine's last-level cache and the figure is DRAM, not cache."""
    import torch

    dev = torch.device(device)
    gpu = dev.type == "cuda"
    mbytes = float(mbytes or (1024 if gpu else 512))
    nbytes = int(mbytes * 1e6)
    with on_device(dev):
        src = torch.ones(nbytes, dtype=torch.uint8, device=dev)   # touched: no first-touch page faults
        dst = torch.empty_like(src)
        t = time_fn(lambda: dst.copy_(src), device=dev, warmup=3 if gpu else 1,
                    repeats=20 if gpu else 5, min_time_s=0.2)
        src = dst = None
    gbps = 2 * nbytes / t.median_s / 1e9
    chip = hardware.lookup(device_name(dev)) if gpu else None
    return {
        "device": str(dev), "mbytes": mbytes, "bytes_moved": 2 * nbytes, **t.as_dict(),
        "GBps": gbps,
        "datasheet_GBps": chip.memory_GBps if chip else None,
        "fraction_of_datasheet": gbps / chip.memory_GBps if chip else None,
    }


def h2d_bandwidth(device, mbytes: float | None = None) -> dict:
    """Host-to-device copy GB/s from pageable and from pinned (page-locked) host memory.

    Pageable memory must first be staged by the driver into a pinned bounce buffer, and the copy
    blocks the host; pinned memory is read by the copy engine directly and can be asynchronous
    (``non_blocking=True``), which is what lets a data loader overlap the copy with compute.
    On the CPU there is no host-to-device copy: the result says so instead of inventing a number.
    """
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return {"available": False, "reason": "no accelerator: host-to-device copy does not apply"}
    mbytes = float(mbytes or 256)
    nbytes = int(mbytes * 1e6)
    with on_device(dev):
        pageable = torch.ones(nbytes, dtype=torch.uint8)
        pinned = pageable.pin_memory()
        dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        t_page = time_fn(lambda: dst.copy_(pageable), device=dev, warmup=2, repeats=10)
        t_pin = time_fn(lambda: dst.copy_(pinned, non_blocking=True), device=dev, warmup=2, repeats=10)
        pageable = pinned = dst = None
    page, pin = nbytes / t_page.median_s / 1e9, nbytes / t_pin.median_s / 1e9
    return {
        "available": True, "device": str(dev), "mbytes": mbytes,
        "pageable_GBps": page, "pinned_GBps": pin, "pinned_speedup": pin / page,
        "pageable": t_page.as_dict(), "pinned": t_pin.as_dict(),
    }


def measure(device=None, quick: bool = False) -> dict:
    """All three ceilings: keys device, device_name, quick, matmul, memcopy, h2d (the dicts of
    the three functions above). ``quick`` uses smaller sizes (seconds, for tests and smoke runs)."""
    import torch

    dev = torch.device(device) if device is not None else default_device()
    gpu = dev.type == "cuda"
    if quick:
        n, copy_mb, h2d_mb = (4096, 256, 64) if gpu else (512, 64, None)
    else:
        n = copy_mb = h2d_mb = None
    return {
        "device": str(dev),
        "device_name": device_name(dev),
        "quick": quick,
        "matmul": matmul_rate(dev, n=n),
        "memcopy": memcopy_bandwidth(dev, mbytes=copy_mb),
        "h2d": h2d_bandwidth(dev, mbytes=h2d_mb),
    }


# ---------------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    import torch

    from preflight.core.records import save_record

    ap = argparse.ArgumentParser(prog="python -m preflight.bench.ceilings", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="results folder (one JSON record per rank)")
    ap.add_argument("--quick", action="store_true", help="smaller sizes: seconds, less accurate")
    ap.add_argument("--device", default=None, help="e.g. cpu or cuda:1 (default: this rank's GPU, else CPU)")
    args = ap.parse_args(argv)

    dev = torch.device(args.device) if args.device else default_device()
    rank = launch_rank()
    results = measure(dev, quick=args.quick)
    params = {"quick": args.quick, "device": str(dev), "rank": rank, "local_rank": local_rank(),
              "world_size": int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", 1)))}
    path = save_record(METHOD.record(params, results), args.out,
                       name=f"rank{rank}" if rank is not None else None)
    mm, mc, h2d = results["matmul"], results["memcopy"], results["h2d"]
    line = (f"[{path.name}] {dev}: matmul {mm['dtype']} n={mm['n']} {mm['tflops']:.2f} TFLOP/s, "
            f"memcopy {mc['GBps']:.1f} GB/s")
    if h2d.get("available"):
        line += f", h2d pageable {h2d['pageable_GBps']:.1f} / pinned {h2d['pinned_GBps']:.1f} GB/s"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
