"""Versioned measurement records: JSON first, DataFrames for notebooks.

A record is what one measurement produced, with everything needed to trust or reject it later
(ml-engineering benchmark practice): the method and its version, the device, library versions, the
date, the parameters and the results. Records are written one file each under a results folder;
the audit can read a folder of records (``--results DIR``) instead of measuring again, which is
how numbers measured on a real cluster reach the report.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
import sys
from pathlib import Path


def versions() -> dict:
    """Python and key library versions (torch only if already imported or importable)."""
    from preflight import __version__

    out = {"python": platform.python_version(), "preflight": __version__}    # also when not pip-installed
    for mod in ("torch", "numpy", "pandas"):
        out[mod] = _version(mod)
    try:
        import torch

        out["cuda"] = torch.version.cuda
        out["hip"] = getattr(torch.version, "hip", None)
    except Exception:  # noqa: BLE001 - torch absent: plan-only use
        pass
    return out


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def make_record(method: str, method_version: int, params: dict, results: dict,
                device: dict | None = None) -> dict:
    if device is None:
        from preflight.device import probe

        device = probe().as_dict()
    return {
        "method": method,
        "method_version": method_version,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "device": device,
        "versions": versions(),
        "argv": sys.argv,
        "params": params,
        "results": results,
    }


def save_record(record: dict, out_dir: str | os.PathLike, name: str | None = None) -> Path:
    """Write ``record`` as ``<out_dir>/<method>[-name].json`` atomically; return the path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = record["method"] + (f"-{name}" if name else "")
    path = out / f"{stem}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str))
    tmp.replace(path)
    return path


def load_records(folder: str | os.PathLike, method: str | None = None) -> list[dict]:
    """All records in ``folder`` (recursively), optionally those of one method, oldest first."""
    recs = []
    for p in sorted(Path(folder).rglob("*.json")):
        try:
            r = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(r, dict) and "method" in r and "results" in r:
            if method is None or r["method"] == method:
                r["_path"] = str(p)
                recs.append(r)
    return sorted(recs, key=lambda r: r.get("date", ""))


def records_frame(records: list[dict]):
    """One row per record: method, date, device name, then flattened params and results."""
    import pandas as pd

    rows = []
    for r in records:
        row = {"method": r["method"], "method_version": r["method_version"], "date": r["date"],
               "device": r.get("device", {}).get("name")}
        row.update({f"param.{k}": v for k, v in r.get("params", {}).items()})
        row.update({k: v for k, v in r.get("results", {}).items()
                    if not isinstance(v, (list, dict)) and k not in row})
        rows.append(row)
    return pd.DataFrame(rows)
