"""Preflight: measure, explain and audit the five pitfalls of scaling AI training on HPC clusters.

Layout (one concept per module):
- ``models/``   pure formulas, no torch import (Amdahl, FLOPs/MFU, communication, extrapolation);
- ``hardware``  the single table of chip peaks;
- ``profile``   the project profile (YAML) schema and its validation;
- ``findings``  the audit's finding contract and verdict rules;
- ``records``   versioned JSON records of measurements;
- ``device``, ``timing``, ``bench/``  live measurements (torch);
- ``charts``, ``widgets``  notebook presentation;
- ``audit``, ``report``, ``cli``  the headless audit.
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
