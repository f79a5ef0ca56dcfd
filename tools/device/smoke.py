"""The device run's first seconds: does every module the audit needs import, at the pinned version?

    python tools/device/smoke.py            # exit 0: all import; 3: one does not (named)

Prints one line per pinned package (``tools/pins.py``, all but the test tools): the version found and
where it came from (the carried wheels in /tmp/site, or the image). A version other than the pin is
said, not refused (the image's numpy or pandas may serve), but an import that fails stops the run
here, in seconds, instead of minutes into the audit. Then torch: version, CUDA build, whether it sees
a GPU, and TF32 / matmul-precision settings (they decide which datasheet peak an fp32 MFU is read
against: ``preflight.core.hardware.fp32_compute_dtype``).
"""
from __future__ import annotations

import importlib
import sys
import time
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pins import _name, pins  # noqa: E402

SKIP = {"jupyterlab", "playwright", "pytest", "pytest-xdist", "hypothesis", "ruff"}   # not used by the audit
MODULE = {"pyyaml": "yaml", "vl-convert-python": "vl_convert", "nvidia-ml-py": "pynvml"}


def main() -> int:
    t0 = time.perf_counter()
    failed = []
    for req in pins():
        name = _name(req)
        if name in SKIP:
            continue
        want = req.split("==", 1)[1] if "==" in req else None
        module = MODULE.get(name, name.replace("-", "_"))
        try:
            importlib.import_module(module)
        except Exception as err:          # noqa: BLE001 - any import failure stops the run, named
            failed.append(f"{name}: import {module} failed: {type(err).__name__}: {str(err)[:200]}")
            print(f"FAIL {name}: {failed[-1]}")
            continue
        try:
            dist = distribution(name)
            got, where = dist.version, str(dist.locate_file(""))
        except PackageNotFoundError:
            got, where = "?", "?"
        flag = "ok  " if got == want or want is None else "DIFF"
        print(f"{flag} {name} {got} (pinned {want}) from {where}")
    try:
        import torch

        import preflight

        print(f"preflight {preflight.__version__}; torch {torch.__version__}, CUDA build {torch.version.cuda}, "
              f"GPU {torch.cuda.is_available() and torch.cuda.get_device_name(0)}, "
              f"float32 matmul precision {torch.get_float32_matmul_precision()!r}, "
              f"cuDNN TF32 {torch.backends.cudnn.allow_tf32}, cuBLAS TF32 {torch.backends.cuda.matmul.allow_tf32}")
    except Exception as err:              # noqa: BLE001
        failed.append(f"torch/preflight: {type(err).__name__}: {err}")
        print(f"FAIL {failed[-1]}")
    print(f"smoke test: {len(failed)} failed in {time.perf_counter() - t0:.1f} s")
    return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
