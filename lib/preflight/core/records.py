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
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from preflight.core.device import versions
from preflight.core.fsutil import atomic_write_text


@dataclass(frozen=True)
class Method:
    """One measurement method: its record name, version and the result fields a chapter reads.

    Each lives next to the one function that measures it (``preflight.bench.<module>``); the
    module's command line and its chapter both call that function and write / read the very same
    record. ``required`` lists dotted paths into ``results`` (``"consume.step_s"``): a record
    without one of them does not fit this version of the chapter (``check``). Bump ``version``
    whenever the meaning or the shape of the results changes."""
    name: str
    version: int
    required: tuple[str, ...] = ()
    # Where the measuring function runs (``ran_on``): "device" the device it is given (the chapter's
    # GPU, else the CPU); "cpu" CPU processes whatever the machine holds (gloo ranks, a training loop
    # kept on the CPU); "ranks" torchrun ranks, on GPUs with NCCL where the node has one per rank,
    # else on the CPU over gloo: the results' ``backend`` (or ``device_kind``) says which.
    runs_on: str = "device"

    def check(self, record: dict, device: dict | None = None) -> list[str]:
        """Why ``record`` cannot be used as this method's measurement (empty list: it fits).

        ``device``: the device the profile describes (``{"table_key": ...}`` for a GPU named in the
        profile, or this machine's ``DeviceInfo.as_dict()`` for ``gpu: auto``); None: any device."""
        problems = []
        if record.get("method") != self.name:
            problems.append(f"method {record.get('method')!r}, expected {self.name!r}")
        if record.get("method_version") != self.version:
            problems.append(f"method version {record.get('method_version')!r}, this Preflight reads "
                            f"version {self.version}")
        results = record.get("results")
        if not isinstance(results, dict):
            problems.append("no results object")
            results = {}
        missing = [path for path in self.required if not _has(results, path)]
        if missing:
            problems.append("missing result field(s) " + ", ".join(f"results.{m}" for m in missing))
        if device is not None and (why := device_mismatch(record.get("device") or {}, device)):
            problems.append(why)
        return problems

    def record(self, params: dict, results: dict, device: dict | None = None) -> dict:
        """A versioned record of this method (``make_record``). ``device`` is the machine it was
        measured on (what ``check`` matches against the profile's GPU); ``ran_on`` says where the bench
        really ran on it: a bench on gloo ranks of a GPU machine ran on its CPU, and says so."""
        if device is None:
            from preflight.core.device import probe

            device = probe().as_dict()
        return make_record(self.name, self.version, params, results, device, ran_on(self, results, device))


def ran_on(method: Method, results: dict, machine: dict) -> dict:
    """Where a measurement really ran, from the method's ``runs_on`` and its results, on ``machine``
    (``DeviceInfo.as_dict()`` of the machine the chapter runs on): ``{"kind": "cuda" | "cpu",
    "backend": "nccl" | "gloo" | None, "basis": how this was told, "label": for messages}``. A bench
    on the CPU of a GPU machine (gloo ranks with one GPU) ran on the CPU, and its record must say so:
    its figures are CPU figures, never the GPU's reference data (``tools/device/keep_reference.py``)."""
    where = _where(method, results, machine)
    if where["kind"] == machine.get("kind"):
        where["label"] = machine.get("label") or machine.get("name") or where["kind"]
    else:
        from preflight.core.device import cpu_info

        where["label"] = (f"{cpu_info().name} (CPU{', ' + where['backend'] if where['backend'] else ''}) "
                          f"of a {machine.get('name', '?')} machine")
    return where


def _where(method: Method, results: dict, machine: dict) -> dict:
    backend, kind = _backend_of(results)
    if backend in ("nccl", "rccl"):
        return {"kind": "cuda", "backend": backend, "basis": "the run's process group backend"}
    if backend in ("gloo", "mpi"):
        return {"kind": "cpu", "backend": backend, "basis": "the run's process group backend"}
    if kind in ("cuda", "cpu"):
        return {"kind": kind, "backend": None, "basis": "the device its ranks ran on (results)"}
    if method.runs_on == "cpu":
        return {"kind": "cpu", "backend": None, "basis": f"method {method.name} runs on the CPU"}
    if method.runs_on == "ranks":
        return {"kind": "cpu", "backend": None,
                "basis": f"method {method.name} recorded no backend: taken as CPU ranks, not a GPU figure"}
    dev = results.get("device") if isinstance(results.get("device"), str) else None
    if dev is not None:
        return {"kind": "cuda" if dev.startswith("cuda") else "cpu", "backend": None,
                "basis": f"the device it was given ({dev})"}
    return {"kind": machine.get("kind") or "cpu", "backend": None, "basis": "the chapter's device"}


def _backend_of(results: dict) -> tuple[str | None, str | None]:
    """(backend, device kind) named in ``results`` or its first row, else Nones."""
    rows = results.get("rows") if isinstance(results.get("rows"), list) else []
    for obj in [results] + [r for r in rows[:1] if isinstance(r, dict)]:
        backend = obj.get("backend")
        kind = obj.get("device_kind") or obj.get("ranks on")
        if backend or kind in ("cuda", "cpu"):
            return backend, kind
    return None, None


def _has(obj, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return False
        obj = obj[part]
    return True


def device_mismatch(recorded: dict, expected: dict) -> str | None:
    """A sentence when a record's device is not the one expected, else None.

    A GPU named in the profile is matched by its hardware-table key; this machine (``gpu: auto``)
    by kind and name (a CPU has no table key)."""
    def label(d):
        return d.get("label") or d.get("table_key") or d.get("name") or "an unknown device"

    if expected.get("kind") is None:                     # the profile names a chip of the hardware table
        if recorded.get("table_key") != expected.get("table_key"):
            return f"measured on {label(recorded)}, the profile says {expected.get('table_key')}"
        return None
    same = (recorded.get("kind") == expected.get("kind")
            and (recorded.get("table_key") or recorded.get("name")) == (expected.get("table_key") or expected.get("name")))
    return None if same else f"measured on {label(recorded)}, this machine is {label(expected)} (profile gpu: auto)"


def make_record(method: str, method_version: int, params: dict, results: dict,
                device: dict | None = None, where: dict | None = None) -> dict:
    if device is None:
        from preflight.core.device import probe

        device = probe().as_dict()
    return {
        "method": method,
        "method_version": method_version,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "device": device,
        "ran_on": where or {"kind": device.get("kind"), "backend": None, "basis": "the device given",
                            "label": device.get("label")},
        "versions": versions(),
        "argv": sys.argv,
        "params": params,
        "results": results,
    }


def save_record(record: dict, out_dir: str | os.PathLike, name: str | None = None) -> Path:
    """Write ``record`` as ``<out_dir>/<method>[-name].json`` atomically and durably (``fsutil``: a
    measurement is expensive to redo); return the path."""
    stem = record["method"] + (f"-{name}" if name else "")
    return atomic_write_text(Path(out_dir) / f"{stem}.json", json.dumps(record, indent=1, default=str))


def load_records(folder: str | os.PathLike, method: str | None = None) -> list[dict]:
    """All records in ``folder`` (recursively), optionally those of one method, oldest first."""
    return read_records(folder, method)[0]


def read_records(folder: str | os.PathLike, method: str | None = None) -> tuple[list[dict], list[str]]:
    """``load_records``, and one line per file named as a record of ``method`` is (``<method>.json``
    or ``<method>-<name>.json``, as ``save_record`` names it) that is not one: torn or not JSON, or
    JSON without ``method`` and ``results``. Such a file is skipped; a chapter names it with these
    lines, so that "no usable record" says why. A file named otherwise cannot be tied to a method and
    is only skipped (as every unreadable file is when ``method`` is None). Each file is read once."""
    recs, unreadable = [], []
    for p in sorted(Path(folder).rglob("*.json")):
        named = method is not None and (p.stem == method or p.stem.startswith(method + "-"))
        try:
            r = json.loads(p.read_text())
        except (OSError, ValueError) as err:
            if named:
                unreadable.append(f"{p.name}: not a readable record ({type(err).__name__}: {str(err)[:120]})")
            continue
        if not (isinstance(r, dict) and "method" in r and "results" in r):
            if named:
                unreadable.append(f"{p.name}: not a record (JSON without 'method' and 'results')")
            continue
        if method is None or r["method"] == method:
            r["_path"] = str(p)
            recs.append(r)
    return sorted(recs, key=lambda r: r.get("date", "")), unreadable


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
