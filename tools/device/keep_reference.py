"""Keep what a device run measured on the GPU as reference data: data/reference/<chip>-<date>/.

Takes the folder where the device run's files landed (tools/device/audit.sh: reference.tgz,
phases.log, versions.txt, nvidia-smi.csv, the logs) and writes

    data/reference/<chip>-<YYYY-MM-DD>/
        records/*.json      the measurements that ran on the GPU (preflight.core.records format), for --results
        traces/*.json.gz    torch.profiler traces of training steps on the GPU (preflight.bench.traces)
        profile.yaml        the example profile with `gpu:` set to this chip, for the replay
        findings.json       the audit's findings, when the audit finished (its CPU parts say so in `source`)
        phases.log versions.txt nvidia-smi.csv *.log
        README.md           chip, driver, versions, date, what was kept and dropped, the replay command

A record is kept only when it ran on the GPU: its ``ran_on.kind`` (``preflight.core.records.ran_on``: the
bench's own device and backend) is ``cuda``; a record without ``ran_on`` (older Preflight) by its
``device.kind``. Every other record is named with why it was dropped: a CPU figure stamped with the
GPU machine's name would be taken for the GPU's. A run that was stopped half-way (a timeout) leaves a
tarball without findings.json: its GPU records are still kept. No GPU record at all is refused.

    python tools/device/keep_reference.py /work/.device/<run>/ [--force] [--dest DIR]

Exit codes: 0 kept; 2 refused (the reason on stderr, nothing written).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIDE_FILES = ("phases.log", "versions.txt", "nvidia-smi.csv", "check.log", "benches.log", "audit.log",
              "gpu-tests.log")
PROFILE = REPO / "data" / "profiles" / "example.yaml"


def slug(text: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def ran_on_gpu(record: dict) -> tuple[bool, str]:
    """Whether ``record`` ran on a GPU, and the words that say where it ran."""
    where = record.get("ran_on")
    if isinstance(where, dict):
        return where.get("kind") == "cuda", f"{where.get('kind')} ({where.get('basis', '?')})"
    dev = record.get("device") or {}
    return dev.get("kind") == "cuda", f"{dev.get('kind')} (device of the record; no ran_on)"


def sort_records(root: Path) -> tuple[list[tuple[Path, dict]], list[str]]:
    """The GPU records under ``root`` (path, record), and one line per file dropped, with why."""
    kept, dropped = [], []
    for p in sorted(root.rglob("*.json")):
        if p.name == "findings.json" or "chapters" in p.parts or "measurements" in p.parts:
            continue
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError) as err:
            dropped.append(f"{p.relative_to(root)}: unreadable ({type(err).__name__})")
            continue
        if not (isinstance(rec, dict) and "method" in rec and "results" in rec):
            continue
        gpu, where = ran_on_gpu(rec)
        if gpu:
            kept.append((p, rec))
        else:
            dropped.append(f"{p.relative_to(root)} ({rec['method']}): ran on {where}")
    return kept, dropped


def replay_profile(table_key: str | None) -> str:
    """The example profile naming ``table_key`` as its GPU: records are matched to the profile's chip
    (``preflight.core.records.device_mismatch``), so the replay must name the chip they came from."""
    text = PROFILE.read_text()
    if table_key is None:
        return text
    new, n = re.subn(r"(?m)^(\s+gpu:\s*)\S+", lambda m: m.group(1) + table_key, text, count=1)
    if n != 1:
        raise ValueError(f"{PROFILE} has no 'gpu:' line to set to {table_key}")
    return (f"# The example profile with the GPU the reference records were measured on ({table_key}),\n"
            f"# written by tools/device/keep_reference.py: the replay matches records to this chip.\n{new}")


def keep(src: Path, dest_root: Path, force: bool = False) -> tuple[Path, list[str]]:
    """Unpack ``src``'s reference.tgz; keep its GPU records, traces and side files in
    ``dest_root/<chip>-<date>/``. Returns that folder and the lines of what was dropped."""
    tgz = src / "reference.tgz"
    if not tgz.is_file():
        raise ValueError(f"{tgz} not found: the device run packed nothing (see its phases.log)")
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(tgz) as tar:
        tar.extractall(tmp, filter="data")
        root = Path(tmp)
        kept, dropped = sort_records(root)
        if not kept:
            raise ValueError(f"{tgz}: no record ran on a GPU, not reference data ({len(dropped)} dropped: "
                             + "; ".join(dropped[:6]) + (" ..." if len(dropped) > 6 else "") + ")")
        machine = kept[0][1]["device"]
        date = min(str(r.get("date", "")) for _, r in kept)[:10]
        dest = dest_root / f"{slug(machine['name'])}-{date}"
        if dest.exists() and not force:
            raise ValueError(f"{dest} exists; --force replaces it")
        shutil.rmtree(dest, ignore_errors=True)
        (dest / "records").mkdir(parents=True)
        for p, _ in kept:
            target = dest / "records" / p.name
            if target.exists():                    # the same file name from two phases: keep both
                target = target.with_name(f"{p.parent.parent.name}-{p.name}")
            shutil.copy(p, target)
        traces = sorted(root.rglob("*.pt.trace.json.gz"))
        gpu_traces = {f for _, r in kept if r["method"] == "traces" for f in r["results"].get("files", [])}
        for t in traces:
            if t.name in gpu_traces:
                (dest / "traces").mkdir(exist_ok=True)
                shutil.copy(t, dest / "traces" / t.name)
            else:
                dropped.append(f"{t.relative_to(root)}: a trace without a GPU record")
        findings = next(iter(sorted(root.rglob("findings.json"))), None)
        if findings is not None:
            shutil.copy(findings, dest / "findings.json")
    for name in SIDE_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, dest / name)
    (dest / "profile.yaml").write_text(replay_profile(machine.get("table_key")))
    (dest / "README.md").write_text(readme([r for _, r in kept], dropped, dest, findings is not None))
    return dest, dropped


def readme(records: list[dict], dropped: list[str], dest: Path, with_findings: bool) -> str:
    m, v = records[0]["device"], records[0].get("versions") or {}
    rel = dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest
    methods = ", ".join(sorted({r["method"] for r in records}))
    lines = [f"# {m['name']}, {min(str(r.get('date', '')) for r in records)[:10]}", "",
             f"- chip: {m['name']} x{m.get('count')}, {m.get('memory_GB') or 0:.0f} GB, driver {m.get('driver')}, "
             f"capability {m.get('capability')}, hardware-table key {m.get('table_key')}",
             f"- versions: python {v.get('python')}, torch {v.get('torch')}, CUDA {v.get('cuda')}, "
             f"preflight {v.get('preflight')}, numpy {v.get('numpy')}, pandas {v.get('pandas')}",
             "- measured by `tools/device/audit.sh`; phases and their exit codes in phases.log",
             f"- kept: {len(records)} records that ran on the GPU ({methods})"
             + ("; findings.json of the audit (its CPU-measured findings name the CPU in `source`)" if with_findings
                else "; the audit did not finish, no findings.json"),
             f"- dropped: {len(dropped)} (measured on the CPU, not reference data)", ""]
    lines += [f"  - {d}" for d in dropped]
    lines += ["", "Audit against these measurements without measuring again (what the records do not cover is "
              "computed from the profile, not measured on this machine):", "",
              f"```bash\npython -m preflight audit {rel}/profile.yaml --plan-only --results {rel}/records\n```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path, help="folder with the device run's reference.tgz and logs")
    ap.add_argument("--dest", type=Path, default=REPO / "data" / "reference")
    ap.add_argument("--force", action="store_true", help="replace an existing folder of the same chip and date")
    args = ap.parse_args(argv)
    try:
        dest, dropped = keep(args.src, args.dest, args.force)
    except (ValueError, OSError, KeyError, tarfile.TarError) as err:
        print(f"keep_reference: {err}", file=sys.stderr)
        return 2
    for line in dropped:
        print(f"dropped: {line}")
    print(f"kept: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
