"""Hardware-layer counters of an NVIDIA GPU, sampled in the background while work runs.

The first of the three profiling layers (hardware / framework / business). NVML, the library
behind ``nvidia-smi``, reports per-GPU counters; ``NvmlSampler`` polls them every ~0.1 s in a
daemon thread::

    with NvmlSampler("cuda:0") as nv:
        train_for_a_while()
    nv.summary()   # medians and maxima
    nv.frame()     # one row per sample

What the counters mean, and do not mean:

- ``gpu_util_pct``: share of the last sample period (1/6 s to 1 s, by GPU) in which *at least one
  kernel* was running. A single tiny kernel, or a kernel spinning while it waits for data, reads
  100%: high utilisation can be fake. It says nothing about how many SMs were busy.
- ``mem_util_pct``: share of the period in which device memory was being read or written.
- ``sm_clock_MHz``, ``power_W``: a GPU throttling on power or heat shows a falling clock.
- ``mem_used_GB``: device memory in use by *all* processes (the allocator's cache included).

Counters update once per driver sample period; polling faster repeats the same values.

Absent data is ``None``, never ``0``: on a CPU, an AMD GPU, a machine without the NVIDIA driver or
without ``nvidia-ml-py``, ``.available`` is False and ``.reason`` says why; a counter a GPU does
not support (power on some boards) is None in every sample.
"""
from __future__ import annotations

import statistics
import threading
import time

FIELDS = ("gpu_util_pct", "mem_util_pct", "sm_clock_MHz", "power_W", "mem_used_GB")


def _resolve(device) -> tuple[list, str | None]:
    """NVML targets to try for ``device``, in order ('GPU-...' UUID strings, int NVML indices), or
    an empty list plus the reason. torch indices follow CUDA_VISIBLE_DEVICES and NVML indices do
    not: the UUID ties the two together where torch exposes it; the index is the fallback."""
    if device is None:
        device = 0
    if isinstance(device, int):
        return [device], None
    import os

    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return [], f"device is {dev.type}: NVML reports NVIDIA GPUs only"
    if not torch.cuda.is_available():
        return [], "no CUDA device visible to torch"
    if getattr(torch.version, "hip", None):
        return [], "ROCm GPU: NVML covers NVIDIA GPUs only (use rocm-smi / amdsmi)"
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    targets: list = []
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        targets.append(text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}")
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if index < len(visible) and visible[index].isdigit():
        targets.append(int(visible[index]))
    elif not visible:
        targets.append(index)
    if not targets:
        return [], f"cannot map torch cuda:{index} to an NVML device (CUDA_VISIBLE_DEVICES={visible})"
    return targets, None


class NvmlSampler:
    """Background sampler of NVML counters (see module docstring). A context manager."""

    def __init__(self, device=0, interval_s: float = 0.1):
        self.interval_s = float(interval_s)
        self.available = False
        self.reason: str | None = None
        self._targets, self.reason = _resolve(device)
        self._rows: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._handle = None

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> NvmlSampler:
        if not self._targets:
            return self
        try:
            import pynvml
        except ImportError:
            self.reason = "nvidia-ml-py (import pynvml) is not installed"
            return self
        try:
            pynvml.nvmlInit()
        except Exception as err:  # noqa: BLE001 - NVMLError_LibraryNotFound etc.: no NVIDIA driver
            self.reason = f"NVML not usable here ({type(err).__name__}: {err})"
            return self
        self._handle, errors = None, []
        for target in self._targets:
            try:
                self._handle = (pynvml.nvmlDeviceGetHandleByUUID(target) if isinstance(target, str)
                                else pynvml.nvmlDeviceGetHandleByIndex(target))
                break
            except Exception as err:  # noqa: BLE001
                errors.append(f"{target!r}: {type(err).__name__}: {err}")
        if self._handle is None:
            pynvml.nvmlShutdown()
            self.reason = "NVML has no such GPU (" + "; ".join(errors) + ")"
            return self
        self._nvml = pynvml
        self.available, self.reason = True, None
        self._t0 = time.perf_counter()
        self._sample()                                    # one sample at once, even for short work
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sample()                                # and one at the end
            self._thread = None
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - a failed shutdown must not discard the measurement
                pass
            self._nvml = None
        return False

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        nv, h = self._nvml, self._handle

        def read(fn):
            try:
                return fn()
            except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: no data, not 0
                return None

        util = read(lambda: nv.nvmlDeviceGetUtilizationRates(h))
        power_mw = read(lambda: nv.nvmlDeviceGetPowerUsage(h))
        mem = read(lambda: nv.nvmlDeviceGetMemoryInfo(h))
        self._rows.append({
            "t_s": time.perf_counter() - self._t0,
            "gpu_util_pct": float(util.gpu) if util is not None else None,
            "mem_util_pct": float(util.memory) if util is not None else None,
            "sm_clock_MHz": read(lambda: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))),
            "power_W": power_mw / 1e3 if power_mw is not None else None,
            "mem_used_GB": mem.used / 1e9 if mem is not None else None,
        })

    # -- results --------------------------------------------------------------------------------
    def frame(self):
        """One row per sample: ``t_s`` (seconds since start) and the counters (None = no data)."""
        import pandas as pd

        return pd.DataFrame(self._rows, columns=["t_s", *FIELDS])

    def summary(self) -> dict:
        """``available``, ``reason``, ``samples``, ``interval_s``, then ``<field>_median`` and
        ``<field>_max`` for each counter; None wherever there is no data."""
        out: dict = {"available": self.available, "reason": self.reason, "samples": len(self._rows),
                     "interval_s": self.interval_s}
        for f in FIELDS:
            vals = [r[f] for r in self._rows if r[f] is not None]
            out[f"{f}_median"] = statistics.median(vals) if vals else None
            out[f"{f}_max"] = max(vals) if vals else None
        return out
