"""The published training runs, as (name, profile, published tokens/s per GPU, family) rows.

    from published_runs import runs
    runs("bridge")      # the calibration rows from Megatron-Bridge's 26.08 / 26.06.01 / 26.06 summaries
    runs("heldout")     # the evaluation rows: never fit on these
    runs("published")   # the 34 runs of data/profiles/published/

Three folders under data/profiles/, each a set of plan profiles plus one index (``published.yaml``,
``bridge.yaml``, ``heldout.yaml``) mapping a run's name to its published figure ``pub_tok_s_gpu`` and, in the
two new sets, its ``family`` = source release x chip x precision (e.g. "bridge-26.08/GB200/mxfp8"). A family
is the unit a leave-one-family-out evaluation holds out. The 34 older runs have no family field: theirs is
derived from the name's source prefix (their README) and the profile's chip and precision.

Every index entry must have its profile and every profile its index entry: a mismatch raises ``ValueError``
naming the file, never a row dropped in silence. Rows in ``<folder>/pending/`` (layouts the profile refuses
today) are not loaded.
"""
from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"published": "published.yaml", "bridge": "bridge.yaml", "heldout": "heldout.yaml"}

# data/profiles/published/README.md's families, by name prefix
_PUBLISHED_SOURCES = (("mlm21-", "mlm21"), ("zero3-", "zero3"), ("kor22-", "kor22"), ("mcore-", "mcore"),
                      ("mpt-", "mpt"), ("tt-", "tt-202412"))


def _published_family(name: str, profile: dict) -> str:
    """Source x chip x precision for a run of data/profiles/published/ (16bit: bf16 or fp16, the sources differ)."""
    source = next((s for prefix, s in _PUBLISHED_SOURCES if name.startswith(prefix)), None)
    if source is None:
        raise ValueError(f"data/profiles/published: run {name!r} has no known source prefix "
                         f"({', '.join(p for p, _ in _PUBLISHED_SOURCES)})")
    training = profile.get("training") or {}
    precision = "fp8" if training.get("fp8") else "16bit"
    return f"{source}/{profile['cluster']['gpu']}/{precision}"


def runs(folder: str | Path) -> list[dict]:
    """The rows of one folder: dicts with name, profile (Path), pub_tok_s_gpu (float > 0), family, set.

    ``folder`` is "published", "bridge", "heldout" or a path to a folder holding one of their index files."""
    path = Path(folder)
    if str(folder) in FOLDERS:
        path = ROOT / "data" / "profiles" / str(folder)
    index = next((path / f for f in FOLDERS.values() if (path / f).is_file()), None)
    if index is None:
        raise ValueError(f"{path}: no index file ({', '.join(FOLDERS.values())}); accepted folders: "
                         f"{', '.join(FOLDERS)} or a path to one")
    entries = yaml.safe_load(index.read_text()) or {}
    if not isinstance(entries, dict):
        raise ValueError(f"{index}: expected a mapping of run name -> fields, got {type(entries).__name__}")
    profiles = {p.stem: p for p in path.glob("*.yaml") if p != index}
    missing = sorted(set(entries) - set(profiles))
    orphans = sorted(set(profiles) - set(entries))
    if missing or orphans:
        raise ValueError(f"{index}: entries without a profile {missing}, profiles without an entry {orphans}")
    rows = []
    for name, fields in sorted(entries.items()):
        figure = fields.get("pub_tok_s_gpu") if isinstance(fields, dict) else None
        if isinstance(figure, bool) or not isinstance(figure, (int, float)) or not figure > 0:
            raise ValueError(f"{index}: {name}.pub_tok_s_gpu = {figure!r}; accepted: a number > 0 (tokens/s per GPU)")
        family = fields.get("family")
        if family is None and index.name == "published.yaml":
            family = _published_family(name, yaml.safe_load(profiles[name].read_text()))
        if not isinstance(family, str) or family.count("/") != 2:
            raise ValueError(f"{index}: {name}.family = {family!r}; accepted: 'source/chip/precision'")
        rows.append(dict(name=name, profile=profiles[name], pub_tok_s_gpu=float(figure), family=family,
                         set=index.stem))
    return rows


def all_runs() -> list[dict]:
    """The three folders' rows together (calibration: published + bridge; evaluation: heldout)."""
    return [row for folder in FOLDERS for row in runs(folder)]
