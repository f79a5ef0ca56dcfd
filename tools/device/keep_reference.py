"""Keep one GPU audit as reference data: data/reference/<chip>-<date>/.

Takes the folder where the device run's files landed (tools/device/audit.sh: reference.tgz,
versions.txt, nvidia-smi.csv, audit.log, gpu-tests.log) and writes

    data/reference/<chip>-<YYYY-MM-DD>/
        findings.json       every finding, with machine, versions, date, timings
        records/*.json      the raw measurements (preflight.records format), for --results
        versions.txt nvidia-smi.csv audit.log gpu-tests.log
        README.md           chip, driver, versions, date, what ran and how to use it

Only a run on a GPU is reference data: a CPU audit is refused. The report's HTML is not kept (it is
generated: `python -m preflight audit data/profiles/example.yaml --results <folder>/records`).

    python tools/device/keep_reference.py /work/.device/<run>/ [--force]
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
SIDE_FILES = ("versions.txt", "nvidia-smi.csv", "audit.log", "gpu-tests.log")


def slug(text: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def keep(src: Path, dest_root: Path, force: bool = False) -> Path:
    """Unpack ``src``'s reference.tgz and side files into ``dest_root/<chip>-<date>/``; its path."""
    tgz = src / "reference.tgz"
    if not tgz.is_file():
        raise ValueError(f"{tgz} not found: the device run left no report (see its audit.log)")
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(tgz) as tar:
        tar.extractall(tmp, filter="data")
        findings = json.loads((Path(tmp) / "findings.json").read_text())
        machine = findings["machine"]
        if machine.get("kind") == "cpu":
            raise ValueError(f"{tgz} was measured on the CPU ({machine.get('label')}): not reference data")
        dest = dest_root / f"{slug(machine['name'])}-{findings['date'][:10]}"
        if dest.exists() and not force:
            raise ValueError(f"{dest} exists; --force replaces it")
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        shutil.copy(Path(tmp) / "findings.json", dest / "findings.json")
        shutil.copytree(Path(tmp) / "records", dest / "records")
    for name in SIDE_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, dest / name)
    (dest / "README.md").write_text(readme(findings, dest))
    return dest


def readme(findings: dict, dest: Path) -> str:
    m, v = findings["machine"], findings["versions"]
    chapters = ", ".join(f"{c['number']} {c['status']} {c['elapsed_s']:.0f} s" for c in findings["chapters"])
    rel = dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest
    return (f"# {m['name']}, {findings['date'][:10]}\n\n"
            f"- chip: {m['name']} x{m.get('count')}, {m.get('memory_GB') or 0:.0f} GB, driver {m.get('driver')}, "
            f"capability {m.get('capability')}\n"
            f"- versions: python {v.get('python')}, torch {v.get('torch')}, CUDA {v.get('cuda')}, "
            f"preflight {v.get('preflight')}, numpy {v.get('numpy')}, pandas {v.get('pandas')}\n"
            f"- date: {findings['date']}; audit of {Path(findings['profile_path']).name} in mode "
            f"{findings['mode']}, {findings['elapsed_s']:.0f} s (chapters: {chapters})\n"
            f"- measured by `tools/device/audit.sh`; the GPU tests' output is in gpu-tests.log\n\n"
            "Audit against these measurements without measuring again:\n\n"
            f"```bash\npython -m preflight audit data/profiles/example.yaml --results {rel}/records\n```\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path, help="folder with the device run's reference.tgz and logs")
    ap.add_argument("--dest", type=Path, default=REPO / "data" / "reference")
    ap.add_argument("--force", action="store_true", help="replace an existing folder of the same chip and date")
    args = ap.parse_args(argv)
    try:
        dest = keep(args.src, args.dest, args.force)
    except (ValueError, OSError, KeyError, tarfile.TarError) as err:
        print(f"keep_reference: {err}", file=sys.stderr)
        return 2
    print(f"kept: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
