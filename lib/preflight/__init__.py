"""Preflight: measure, explain and audit the five pitfalls of scaling AI training on HPC clusters.

Wings by role, bottom to top; a wing imports only the wings listed before it (tests/test_layout.py):

- ``core/``       the contracts every layer shares: profile, findings, records, the hardware table,
                  the device, timing, atomic writes, numbers for people, the workload contract;
- ``models/``     pure formulas, no torch import (Amdahl, FLOPs/MFU, communication, memory, bubbles...);
- ``diagnose/``   evidence read from a team's real job (NCCL logs, topology; profiler traces next);
- ``toolkit/``    the public part: what a team takes into its own training loop (its ``__init__``
                  lists every promised name);
- ``harness/``    what the measurement methods run on (launch, reference models, training loop, NVML);
- ``bench/``      the measurement methods, one per file, each runnable alone, one JSON record each;
- ``chapters/``   the five chapters' audit logic, the advisor, the exercises, the registry;
- ``reporting/``  the report, its charts and tables, what to fix first, the comparison;
- ``widgets/``    the notebooks' sliders;
- ``runner/``     the audit's machinery: the chapter runtime, plan-only and measure-mode audits, ``check``;
- ``cli``         the command line (``python -m preflight ...``).
"""

import sys
from pathlib import Path

# jsonschema, which altair and nbformat import, loads the optional ``rfc3987-syntax`` package when it is
# installed (JupyterLab's jupyter-events pulls it in): it compiles 39 lark grammars at import, about 2.5 CPU-s
# in every process (kernels and command lines alike), for the "iri" format checks, which no schema
# Preflight validates uses. Preflight's processes skip it; jsonschema then leaves those two formats
# unchecked, as it does whenever the package is absent. Measured on 2 cores: ``import jsonschema``
# 2.75 CPU-s with it, 0.23 without (tests/test_packaging.py keeps it skipped).
sys.modules.setdefault("rfc3987_syntax", None)

__version__ = "0.1.0"
REPO = Path(__file__).resolve().parents[2]      # the checkout: playbook/, data/ (editable install)
