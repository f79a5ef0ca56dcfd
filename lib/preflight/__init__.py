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

from pathlib import Path

__version__ = "0.1.0"
REPO = Path(__file__).resolve().parents[2]      # the checkout: playbook/, data/ (editable install)
