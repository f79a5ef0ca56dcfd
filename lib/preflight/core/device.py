"""What accelerator is here: CUDA (NVIDIA or ROCm through torch), or the CPU fallback.

``probe()`` is the single source of the device facts every record and report shows. On a CPU-only
machine everything still runs, and every figure is labelled as measured on the CPU.

Importing torch costs 1-3 s of CPU on a small machine, more than the whole plan-only audit's
formulas. Where torch's own build says that it can reach no accelerator (a CPU build: its
``torch/version.py`` names no CUDA, HIP or XPU, and the machine is not a Mac, where MPS needs no
build flag), ``torch.cuda.is_available()`` is False whatever the machine holds, so ``probe()`` gives
the CPU answer from that file without importing torch (``torch_build``), unless OpenMP settings would
pin the process to fewer cores as torch loads (``answers_without_torch``). Any other build is asked
the usual way, through torch.
"""
from __future__ import annotations

import ast
import os
import platform
import sys
from dataclasses import asdict, dataclass, field

from preflight.core import hardware


@dataclass
class DeviceInfo:
    kind: str                   # "cuda" or "cpu"
    name: str                   # e.g. "NVIDIA H200" or the CPU model
    count: int                  # devices of that kind (CPU: logical cores usable)
    memory_GB: float | None     # per device (CPU: host RAM)
    driver: str | None = None
    torch: str | None = None
    cuda: str | None = None
    capability: str | None = None
    table_key: str | None = None   # key in preflight.core.hardware.CHIPS, None when unknown
    notes: list[str] = field(default_factory=list)

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def label(self) -> str:
        return f"{self.name} ({'GPU' if self.is_gpu else 'CPU fallback'})"

    def as_dict(self) -> dict:
        d = asdict(self)
        d["label"] = self.label
        return d


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _host_memory_GB() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return None


def _nvml_driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else v
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML (CPU, AMD): reported as None
        return None


def torch_build() -> dict | None:
    """torch's build facts (``__version__``, ``cuda``, ``hip``, ``xpu``: None where not built for it),
    read from the installed ``torch/version.py`` (literal assignments, generated at build time) without
    importing torch, or from the module when torch is already imported; None without a torch, or
    when the file cannot be read as such (then ask torch itself)."""
    keys = ("__version__", "cuda", "hip", "xpu")
    loaded = sys.modules.get("torch")
    if loaded is not None and hasattr(loaded, "version"):
        return {k: getattr(loaded.version, k, None) for k in keys}
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.origin:
            return None
        with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
            tree = ast.parse(f.read())
        got = {}
        for node in tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name) and target.id in keys:
                        got[target.id] = ast.literal_eval(node.value)
    except (OSError, SyntaxError, ValueError, ImportError):
        return None
    if not isinstance(got.get("__version__"), str):
        return None
    return {k: got.get(k) for k in keys}


def cpu_only_build(build: dict | None) -> bool:
    """True when this torch can reach no accelerator: built for none (no CUDA, HIP or XPU) and not on
    a Mac (MPS). Then the CPU fallback is certain without asking torch."""
    return (build is not None and sys.platform != "darwin"
            and all(build.get(k) is None for k in ("cuda", "hip", "xpu")))


# OpenMP settings with which loading torch's OpenMP runtime pins this process to fewer cores: with
# OMP_PROC_BIND=true on 2 cores, os.sched_getaffinity gave 2 before `import torch` and 1 after.
PINNING_VARIABLES = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")


def answers_without_torch(build: dict | None) -> bool:
    """Whether ``probe`` can answer without importing torch and give what torch would: a CPU build
    (``cpu_only_build``), and no OpenMP pinning that the import would apply (``PINNING_VARIABLES``;
    the cores this process may use are part of the answer)."""
    return cpu_only_build(build) and not any(os.environ.get(v) for v in PINNING_VARIABLES)


_CPU_NOTE = ("no CUDA/ROCm device found: measurements run on the CPU and are labelled as such; "
             "GPU-only parts are shown as not available")


def _cpu_info(torch_version: str, notes: list[str]) -> DeviceInfo:
    return DeviceInfo(kind="cpu", name=_cpu_name(), count=len(os.sched_getaffinity(0)),
                      memory_GB=_host_memory_GB(), torch=torch_version, notes=notes)


def cpu_info() -> DeviceInfo:
    """This machine's CPU as a device (where a bench on CPU processes ran, GPU or not here)."""
    build = torch_build()
    return _cpu_info(build["__version__"] if build else None, ["measured on the CPU (its processes ran there)"])


def probe() -> DeviceInfo:
    """This machine as torch sees it (``probe_with_torch``); a CPU build of torch is not imported for
    it (module docstring) when the answer is the same without (``answers_without_torch``)."""
    build = torch_build()
    if answers_without_torch(build):
        return _cpu_info(build["__version__"], [_CPU_NOTE])
    return probe_with_torch()


def probe_with_torch() -> DeviceInfo:
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        name = torch.cuda.get_device_name(0)
        return DeviceInfo(
            kind="cuda", name=name, count=torch.cuda.device_count(),
            memory_GB=props.total_memory / 1e9, driver=_nvml_driver(), torch=torch.__version__,
            cuda=torch.version.cuda or getattr(torch.version, "hip", None),
            capability=f"{props.major}.{props.minor}",
            table_key=(hardware.lookup(name).name if hardware.lookup(name) else None),
        )
    notes = [_CPU_NOTE]
    for kind in ("xpu", "mps"):      # other accelerators torch knows; not measured by Preflight yet
        backend = getattr(torch, kind, None)
        if backend is not None and getattr(backend, "is_available", lambda: False)():
            notes.append(f"a torch '{kind}' device is present but not supported yet: the CPU is measured")
    return _cpu_info(torch.__version__, notes)


def torch_device(info: DeviceInfo | None = None):
    """The torch device of this process (its local rank's GPU under torchrun / srun)."""
    import torch

    info = info or probe()
    return default_device() if info.is_gpu else torch.device("cpu")


# --- which device am I: launcher environment -------------------------------------------------------
def launch_rank() -> int | None:
    """Global rank from the launcher (torchrun: ``RANK``; srun: ``SLURM_PROCID``), None when alone."""
    for var in ("RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def local_rank() -> int:
    """Rank inside this node (torchrun: ``LOCAL_RANK``; srun: ``SLURM_LOCALID``), 0 when alone."""
    for var in ("LOCAL_RANK", "SLURM_LOCALID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def default_device():
    """This process's device: its local rank's GPU, or the CPU when there is no GPU."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", gpu_index(local_rank(), torch.cuda.device_count()))
    return torch.device("cpu")


def gpu_index(local: int, gpus: int) -> int:
    """The GPU of local rank ``local`` on a node with ``gpus`` visible GPUs: the same index. More ranks
    than GPUs is refused: ranks that share one GPU each report that GPU's figures as their own
    (throughput, memory, MFU), and each measures the others' load too."""
    if local >= gpus:
        raise RuntimeError(f"local rank {local} has no GPU of its own: this node shows {gpus} GPU(s) "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); start at most "
                           f"{gpus} process(es) per node (torchrun --nproc-per-node {gpus}, srun --ntasks-per-node "
                           f"{gpus}), or run on the CPU with --device cpu")
    return local


def torch_fp32_precision(model=None) -> dict:
    """What this process lets fp32 matmuls and convolutions use (torch imported here): the matmul
    precision setting, cuDNN's TF32 switch, whether ``model`` has convolutions, and the resulting
    ``peak_dtype`` (``fp32_compute_dtype``). Recorded with every fp32 matmul figure."""
    import torch

    has_conv = model is not None and any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
    prec = torch.get_float32_matmul_precision()
    conv = bool(torch.backends.cudnn.allow_tf32)
    return {"float32_matmul_precision": prec, "cudnn_allow_tf32": conv, "has_conv": has_conv,
            "peak_dtype": hardware.fp32_compute_dtype(prec, conv, has_conv)}


def on_device(device):
    """Make ``device`` the current CUDA device for the block (CUDA events record on the *current*
    device's stream, so timing ``cuda:1`` while ``cuda:0`` is current would time the wrong GPU)."""
    import contextlib

    import torch

    dev = torch.device(device)
    return torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()


def device_name(device) -> str | None:
    """Driver name of a GPU (e.g. 'NVIDIA H200'), None for the CPU."""
    import torch

    dev = torch.device(device)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else None


class BackgroundProbe:
    """``python -m preflight.core.device`` (this machine's probe and library versions, as JSON) in a child
    process; ``result()`` waits for it and gives ``(machine dict, versions dict)``.

    For the plan-only audit: probing imports torch (1-3 s of CPU on two cores), which nothing else in
    it needs; the child does it on another core while the chapters run. Where ``probe`` answers
    without torch (``answers_without_torch``: a CPU build) no child is started: ``result()`` probes
    here, in milliseconds. If the child fails, the probe runs here instead (one line on stderr says
    why): the answer is the same, only slower. ``stop()`` ends the child (Ctrl-C)."""

    def __init__(self):
        import subprocess

        self._child = None if answers_without_torch(torch_build()) else subprocess.Popen(
            [sys.executable, "-P", "-m", "preflight.core.device"],       # -P: no user folder first on the path
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(self, timeout_s: float = 120) -> tuple[dict, dict]:
        import json
        import subprocess

        if self._child is None:
            return probe().as_dict(), versions()
        why = "its reply was not the probe's JSON"
        try:
            out, err = self._child.communicate(timeout=timeout_s)
            if self._child.returncode != 0:
                last = (err or "").strip().splitlines()[-1:] or ["no message"]
                why = f"it exited with code {self._child.returncode}: {last[0][:200]}"
                raise ValueError(why)
            got = json.loads(out)
            return dict(got["machine"]), dict(got["versions"])
        except subprocess.TimeoutExpired:
            why = f"it gave no answer in {timeout_s:g} s"
        except (ValueError, KeyError, TypeError):
            pass
        finally:
            self.stop()
        print(f"preflight: the background device probe failed ({why}); probing in this process instead",
              file=sys.stderr)
        return probe().as_dict(), versions()            # same answer, only slower

    def stop(self) -> None:
        if self._child is not None and self._child.poll() is None:
            self._child.kill()
            self._child.wait()


def versions() -> dict:
    """Python and key library versions; torch's CUDA / HIP build from its build file, without
    importing torch (``device.torch_build``; absent keys: no torch)."""
    from preflight import __version__

    out = {"python": platform.python_version(), "preflight": __version__}    # also when not pip-installed
    for mod in ("torch", "numpy", "pandas"):
        out[mod] = _version(mod)
    build = torch_build()
    if build is not None:
        out["cuda"] = build["cuda"]
        out["hip"] = build["hip"]
    return out


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None

if __name__ == "__main__":          # python -m preflight.core.device: what a record says about this machine
    import json


    print(json.dumps({"machine": probe().as_dict(), "versions": versions()}, indent=1))
