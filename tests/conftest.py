import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "data" / "profiles" / "example.yaml"


def example_with(**changes) -> dict:
    """The example profile as a plain dict, with fields changed by ``section__field=value``
    (``training__zero_stage=1``; nested deeper with more ``__``). Not validated: tests feed it to the
    validator, or to ``plan_findings``."""
    import yaml

    d = yaml.safe_load(EXAMPLE.read_text())
    for path, value in changes.items():
        node = d
        *parents, last = path.split("__")
        for key in parents:
            node = node[key]
        node[last] = value
    return d


def plan_findings(add_plan_findings, **changes):
    """A chapter's ``add_plan_findings(sink, profile)`` on the example profile with ``changes``
    (validated like a user's profile); returns what it returned and the findings by id."""
    from preflight.core.findings import FindingSink
    from preflight.core.profile import parse_profile

    sink = FindingSink()
    out = add_plan_findings(sink, parse_profile(example_with(**changes)))
    return out, {f.id: f for f in sink.findings}


# `make test` runs the suite in two processes (pytest-xdist, `-n 2 --dist loadfile`): on a 2-core box one
# test mostly keeps one core busy (the quick measured audit: 112 % CPU), so two files at once nearly halve
# the wall time. `loadfile` keeps each file on one worker, so its module fixtures (a measured audit, a
# Slurm cluster, a JupyterLab server) run once. (`loadgroup` would group by mark, but xdist 3.8 renames
# the test ids for it through an attribute pytest 9 no longer reads: its groups are ignored.) The
# longest files start first, so that neither worker is left with one of them at the end (idle CI
# seconds at 7e0cf7c / 39d1f8d).
LONGEST_FIRST = ("test_workload_audit.py",   # two measured workload audits, ~500 s
                 "test_browser.py",          # five chapters Run All in JupyterLab, ~350 s
                 "test_slurm.py",            # walltime requeue round trips, ~400 s
                 "test_cluster_path.py",     # every standalone bench under torchrun, then audit --results, ~300 s
                 "test_audit.py",            # the measured --quick audit, ~300 s
                 "test_slurm_nodes.py",      # a two-node Slurm cluster
                 "test_audit_robustness.py",  # extreme profiles through every chapter, ~230 s
                 "test_chart_fit.py")


def pytest_collection_modifyitems(config, items):
    """The longest test files first (xdist hands out whole files in this order)."""
    def rank(item):
        name = Path(item.fspath).name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)                 # stable: each file keeps its own order, the others theirs


@pytest.fixture
def example_yaml() -> str:
    return EXAMPLE.read_text()


def run_cli(*args, cwd=None, timeout=900):
    """Run ``python -m preflight ...`` as a user would; return the CompletedProcess."""
    import subprocess

    env = dict(os.environ)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO / ".pytest_cache" / "inductor"))
    return subprocess.run([sys.executable, "-m", "preflight", *map(str, args)], cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=timeout, env=env)


def cli_cpu_seconds(*args, cwd=None, timeout=900):
    """``run_cli`` and the CPU seconds (user + system) it and its children used: (CompletedProcess,
    seconds). A time budget asserted on CPU seconds holds when another job shares the cores; wall
    time does not (``check`` took 1.4-1.8 s wall, 1.2-1.4 CPU-s, beside a loaded test suite)."""
    import resource

    def used():
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    before = used()
    result = run_cli(*args, cwd=cwd, timeout=timeout)
    return result, used() - before


CPU_RECORDS = REPO / "tests" / "data" / "cpu_records"


def records_of_this_machine(tmp_path: Path) -> tuple[Path, Path]:
    """tests/data/cpu_records (a real quick run on another 2-core CPU box) copied under ``tmp_path``
    with each record's device set to this machine's, and the example profile with ``gpu: auto``:
    the pair an audit accepts (a record must come from the device the profile describes; see
    ``preflight.core.records.device_mismatch``). Returns (results folder, profile path)."""
    import json
    import shutil

    import yaml

    from preflight.core.device import probe

    results = tmp_path / "cpu_records"
    shutil.copytree(CPU_RECORDS, results)
    here = probe().as_dict()
    for p in results.rglob("*.json"):
        rec = json.loads(p.read_text())
        rec["device"] = here
        p.write_text(json.dumps(rec, indent=1))
    profile = tmp_path / "auto.yaml"
    profile.write_text(yaml.safe_dump(example_with(cluster__gpu="auto")))
    return results, profile
