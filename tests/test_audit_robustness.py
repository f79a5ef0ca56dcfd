"""Robustness of the audit. (1) Extreme but valid profiles (hypothesis over the schema's ranges, plus named
edge cases): every chapter's plan findings compute without exception, no NaN/inf value, no 'nan'/'inf' in
a message, and a value is None only where the message says why. (2) Two plan-only audits at once into
different folders do not interfere. (3) Ctrl-C (SIGINT) mid-audit: exit 130, one line, no traceback,
no report presented as complete."""
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import EXAMPLE, REPO
from preflight.chapters import baseline as B
from preflight.chapters import communication as CM
from preflight.chapters import data_pipeline as DP
from preflight.chapters import fault_tolerance as FT
from preflight.chapters import load_balance as LB
from preflight.chapters import memory_plan as MP
from preflight.core.findings import FindingSink
from preflight.core.profile import Profile, parse_profile

BASE = yaml.safe_load(EXAMPLE.read_text())
TRIED: set[str] = set()
SECTIONS = {n: i.annotation for n, i in Profile.model_fields.items() if n in ('model', 'cluster', 'training', 'data')}
NOT_A_NUMBER = re.compile(r"(?<![a-z])(nan|inf|-inf)(?![a-z])", re.IGNORECASE)
# a value left None must say why: not measured / not computed / unbounded / not judged / unknown
WHY_NONE = re.compile(r"not measured|cannot represent|without bound|unbounded|no failures|unknown|not judged|"
                      r"never|no serial", re.IGNORECASE)


def _divisors(n: int, cap: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(d for d in set(small + [n // d for d in small]) if d <= cap)


def _in(path: str):
    """Floats over the schema's whole range for ``section.field`` (hypothesis tries the edges)."""
    section, key = path.split(".")
    b = {a: getattr(m, a) for m in SECTIONS[section].model_fields[key].metadata for a in ("ge", "gt", "le", "lt")
         if getattr(m, a, None) is not None}
    return st.floats(b.get("ge", b.get("gt")), b.get("le", b.get("lt")), exclude_min="gt" in b, exclude_max="lt" in b)


@st.composite
def valid_profiles(draw) -> dict:
    gpn = draw(st.sampled_from([1, 8, 64]) | st.integers(1, 64))
    nodes = draw(st.sampled_from([1, 15_625, 100_000]) | st.integers(1, 100_000))
    gpus = gpn * nodes
    tp = draw(st.sampled_from(_divisors(gpus, 1024)))
    pp = draw(st.sampled_from(_divisors(gpus // tp, 1024)))
    heads = tp * draw(st.integers(1, max(1, 100_000 // tp)))
    hidden = heads * draw(st.integers(max(1, -(-8 // heads)), max(1, 1_000_000 // heads)))
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "interleaved"]))
    inter = schedule == "interleaved" and pp > 1
    m = pp * draw(st.integers(1, 100_000 // pp)) if inter else draw(st.integers(1, 100_000))
    return {
        "project": "x", "measure": False,
        "model": {"params": draw(_in("model.params")), "layers": draw(st.integers(1, 10_000)), "hidden": hidden,
                  "heads": heads, "seq_len": draw(st.integers(1, 10_000_000)), "vocab": draw(st.integers(1, 10_000_000))},
        "cluster": {"gpu": draw(st.sampled_from(["H100-SXM", "A100-SXM", "auto"])), "gpus_per_node": gpn,
                    "nodes": nodes, "intra_node_GBps": draw(_in("cluster.intra_node_GBps")),
                    "inter_node_Gbps": draw(_in("cluster.inter_node_Gbps")),
                    "node_failure_per_day": draw(_in("cluster.node_failure_per_day")),
                    "walltime_h": draw(_in("cluster.walltime_h")),
                                           "gpu_memory_GB": draw(st.none() | _in("cluster.gpu_memory_GB"))},
        "training": {"step_compute_s": draw(_in("training.step_compute_s")), "step_serial_s": draw(_in("training.step_serial_s")),
                     "grad_dtype": draw(st.sampled_from(["fp32", "bf16", "fp16"])), "tp": tp, "pp": pp,
                     "microbatches": m, "pipeline_schedule": schedule,
                     "interleave": draw(st.integers(1, 128)) if schedule == "interleaved" else 1,
                     "checkpoint_write_s": draw(_in("training.checkpoint_write_s")), "run_days": draw(_in("training.run_days")),
                     "restart_s": draw(_in("training.restart_s")), "micro_batch_size": draw(st.integers(1, 65_536)),
                     "zero_stage": draw(st.integers(0, 3)),
                     "activation_recompute": draw(st.sampled_from(["none", "selective", "full"])),
                     "sequence_parallel": draw(st.booleans()),
                     "checkpoint_interval_s": draw(st.none() | _in("training.checkpoint_interval_s"))},
        "data": {"files": draw(st.integers(1, 10 ** 12)), "mean_file_kB": draw(_in("data.mean_file_kB")),
                 "storage": draw(st.sampled_from(["lustre", "gpfs", "nfs", "local_nvme", "object"])),
                 "length_median": draw(st.integers(1, 10_000_000)), "length_sigma": draw(_in("data.length_sigma"))},
    }


def plan_findings(d: dict):
    """Every chapter's plan-only findings, as the notebooks call them (measurements None)."""
    p = parse_profile(d)
    sink = FindingSink()
    B.add_plan_findings(sink, p, B.plan_curve(p))
    B.add_measured_findings(sink, None, None)
    B.add_measured_scaling(sink, None, "plan-only")
    MP.add_plan_findings(sink, p, None)
    MP.add_validation_finding(sink, None)
    MP.bubble_memory_table(p, p.training.pp if p.training.pp > 1 else 4)
    DP.listing_table(p)
    DP.add_listing_finding(sink, p)
    DP.add_measured_findings(sink, p, None, None, None)
    CM.add_plan_findings(sink, p)
    CM.add_sweep_findings(sink, p, None)
    CM.add_overlap_findings(sink, None, None)
    CM.add_topology_finding(sink, p)
    LB.add_plan_findings(sink, p, None)
    LB.add_measured_findings(sink, None, None, None)
    FT.add_plan_findings(sink, p)
    FT.add_measured_findings(sink, None, None, None)
    return sink.findings


def check_findings(d: dict) -> None:
    TRIED.add(json.dumps(d, sort_keys=True))
    for f in plan_findings(d):
        text = f"{f.threshold} {f.message} {f.fix}"
        assert not NOT_A_NUMBER.search(text), (f.id, text)
        if f.value is None:         # (a unit-less finding such as communication/topology carries a verdict only)
            assert not f.unit or WHY_NONE.search(f.message), (f.id, f.message)
        else:
            assert math.isfinite(f.value), f


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(valid_profiles())
@pytest.mark.slow
def test_extreme_valid_profiles_give_finite_findings(d):
    check_findings(d)


def _with(**changes) -> dict:
    d = json.loads(json.dumps(BASE))
    for path, v in changes.items():
        section, key = path.split("__")
        d[section][key] = v
    return d


NAMED = {
    "1 GPU": _with(cluster__nodes=1, cluster__gpus_per_node=1),
    "1e6 GPUs": _with(cluster__nodes=15_625, cluster__gpus_per_node=64),
    "pp > layers": _with(model__layers=2, training__pp=8),
    "zero failure rate": _with(cluster__node_failure_per_day=0.0),
    "certain failure": _with(cluster__node_failure_per_day=0.999999, cluster__nodes=100_000),
    "zero serial time": _with(training__step_serial_s=0.0),
    "smallest model": _with(model__params=1e3, model__layers=1, model__hidden=8, model__heads=1, model__seq_len=1,
                            model__vocab=1),
    "largest model": _with(model__params=1e14, model__layers=10_000, model__hidden=1_000_000, model__heads=100_000,
                           model__seq_len=10_000_000, model__vocab=10_000_000),
    "checkpoint_write_s 0": _with(training__checkpoint_write_s=0.0),
    "checkpoint_write_s 0, no failures": _with(training__checkpoint_write_s=0.0, cluster__node_failure_per_day=0.0),
    "huge walltime": _with(cluster__walltime_h=10_000.0, training__run_days=3650.0),
    "tiny walltime": _with(cluster__walltime_h=0.01, training__checkpoint_interval_s=None),
    "no checkpoint interval": _with(training__checkpoint_interval_s=None),
    "restart 0": _with(training__restart_s=0.0),
    "tiny compute": _with(training__step_compute_s=1e-6, training__step_serial_s=0.0),
    "one file, one byte": _with(data__files=1, data__mean_file_kB=1e-3),
    "sigma 0": _with(data__length_sigma=0.0, data__length_median=10_000_000),
}


@pytest.mark.parametrize("name", NAMED)
def test_named_extremes(name):
    check_findings(NAMED[name])


@pytest.fixture(scope="module", autouse=True)
def _report_counts(request):
    yield
    capman = request.config.pluginmanager.get_plugin("capturemanager")
    with capman.global_and_fixture_disabled():
        print(f"\nextreme valid profiles tried: {len(TRIED)} distinct, every chapter's plan findings finite")


# -- two audits at once; an interrupted audit ---------------------------------------------------------

def _audit(profile, out, *extra, plan_only: bool = True) -> subprocess.Popen:
    """A plan-only audit runs its chapters in its own process; a measure-mode one in a kernel each."""
    cmd = [sys.executable, "-m", "preflight", "audit", str(profile), *(["--plan-only"] if plan_only else []),
           "--out", str(out), *extra]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _children(pid: int) -> list[int]:
    kids = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return kids


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def two_audits(tmp_path_factory):
    """Two plan-only audits (chapters 1 and 4: charts, memory plan, padding) started together into two
    folders, on two different profiles so that a mix-up shows in the numbers."""
    base = tmp_path_factory.mktemp("two")
    prof_b = base / "b.yaml"
    prof_b.write_text(yaml.safe_dump(_with(cluster__nodes=8) | {"project": "run-b"}))
    runs = {"a": (EXAMPLE, 1024), "b": (prof_b, 64)}
    procs = {k: _audit(p, base / k, "--chapters", "1,4") for k, (p, _) in runs.items()}
    done = {k: p.communicate(timeout=900) + (p.returncode,) for k, p in procs.items()}
    return base, runs, done


def test_two_audits_at_once_do_not_interfere(two_audits):
    base, runs, done = two_audits
    layouts = []
    for k, (_prof, gpus) in runs.items():
        stdout, stderr, rc = done[k]
        assert rc == 0, (k, stdout, stderr)
        assert "Traceback" not in stderr and "database is locked" not in stderr and "in use" not in stderr, stderr
        out = base / k
        s = json.loads((out / "findings.json").read_text())
        other = "run-b" if k == "a" else "llm-7b-pretrain"
        assert s["project"] == ("llm-7b-pretrain" if k == "a" else "run-b")
        f = {x["id"]: x for x in s["findings"]}
        assert f["baseline/amdahl_speedup_at_target"]["value"] == pytest.approx(0.89 / (0.09 + 0.8 / gpus))
        assert f"dp={gpus}" in f["baseline/memory_per_gpu"]["message"]
        assert {c["status"] for c in s["chapters"]} == {"ok"}
        index = (out / "index.html").read_text()
        assert "INCOMPLETE" not in index and other not in index
        for nb in (out / "notebooks").glob("*.ipynb"):     # each audit wrote into its own folder only
            text = nb.read_text()
            assert str(out) in text and str(base / ("b" if k == "a" else "a")) + '"' not in text, nb
        assert not list(out.rglob("*.tmp")) and not list(out.rglob(".*.tmp"))
        layouts.append(sorted(str(p.relative_to(out)) for p in out.rglob("*")))
    assert layouts[0] == layouts[1]            # same files on both sides: nothing missing, nothing extra
    assert "charts/baseline--amdahl.svg" in layouts[0] and "charts/load_balance--padding_waste.svg" in layouts[0]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
@pytest.mark.parametrize("in_process", [False, True], ids=["kernels", "in-process"])
def test_interrupted_audit_leaves_no_complete_report(two_audits, tmp_path, sig, in_process):
    """Into a folder that holds a complete earlier report: stopped mid-run, the folder must not present
    the old or a partial report as this run's. A measure-mode audit (quick) is stopped once chapter 1's
    kernel is up; a plan-only one, which runs its chapters in its own process, as chapter 1 starts."""
    import shutil

    out = tmp_path / "o"
    shutil.copytree(two_audits[0] / "a", out)
    assert (out / "findings.json").exists() and (out / "01_baseline.html").exists()
    p = _audit(EXAMPLE, out, "--chapters", "1,4", *([] if in_process else ["--quick"]), plan_only=in_process)
    for line in p.stdout:                       # chapter 1 has started ...
        if "chapter 1 baseline: running" in line:
            break
    if not in_process:
        deadline = time.time() + 60             # ... and its kernel is up
        while not _children(p.pid) and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(2)
    kernels = _children(p.pid)
    p.send_signal(sig)
    stdout, stderr = p.communicate(timeout=120)
    try:
        index = (out / "index.html").read_text()
        assert "INCOMPLETE" in index and "This is not an audit report" in index
        assert not (out / "findings.json").exists()
        assert not (out / "01_baseline.html").exists() and not (out / "04_load_balance.html").exists()
        if sig == signal.SIGINT:
            assert p.returncode == 130, (p.returncode, stderr)
            assert stderr.count("\n") == 1 and stderr.startswith("error: audit interrupted (Ctrl-C)"), stderr
            assert "Traceback" not in stderr and "INCOMPLETE" in stderr
            assert "interrupted (Ctrl-C) after 0 of 2 chapters" in index
            time.sleep(1)
            assert in_process or kernels, "a measure-mode audit runs chapter 1 in a kernel"
            assert not any(_alive(k) for k in kernels), "the kernel must be stopped"
        else:
            assert p.returncode == -signal.SIGKILL
            assert "Audit in progress since" in index
    finally:
        for k in kernels:                       # kill -9 leaves the kernel to its parent poller: end ours
            if _alive(k):
                os.kill(k, signal.SIGKILL)


def test_ctrl_c_turns_logging_off_for_nbclients_cleanup():
    """The Ctrl-C handler kills the kernel and turns logging off before nbclient's cleanup runs the
    event loop once more: its kernel-alive poll, when due then, logged "Kernel died while waiting for
    execute reply." of the kernel we killed (the test above failed so in 1 of 4-6 runs). The audit turns it
    back on when it has cleaned up (audit.run_audit's finally)."""
    import logging

    from preflight.runner import kernels

    previous = kernels.trap_sigint([])
    try:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert logging.root.manager.disable >= logging.CRITICAL
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN       # a second Ctrl-C is ignored
    finally:
        signal.signal(signal.SIGINT, previous)
        logging.disable(logging.NOTSET)


def test_an_audit_stopped_by_ctrl_c_turns_logging_back_on(monkeypatch, tmp_path):
    """Ctrl-C as the report is written (after the chapters, where no event-loop clean-up runs):
    run_audit exits 130 and leaves logging as it found it (fails when its finally does not restore
    what kernels.trap_sigint turned off)."""
    import logging

    from preflight.core.profile import load_profile
    from preflight.runner import audit

    def interrupted(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)      # the audit's own Ctrl-C handler: logging off, KeyboardInterrupt
        raise AssertionError("the handler raises")

    monkeypatch.setattr(audit, "_publish", interrupted)
    before_handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as stop:
            audit.run_audit(load_profile(EXAMPLE), EXAMPLE, tmp_path / "o", chapters=[2], plan_only=True)
        assert stop.value.code == audit.INTERRUPTED_EXIT
        assert logging.root.manager.disable == logging.NOTSET
    finally:
        signal.signal(signal.SIGINT, before_handler)
        logging.disable(logging.NOTSET)


def test_progress_estimates_the_time_left_from_the_runs_pace():
    from preflight.runner import audit as A

    t = A.TYPICAL_CHAPTER_S
    assert A.time_left([], [1, 2, 3, 4, 5], 0.0) == pytest.approx(sum(t.values()))
    # twice as slow as typical on chapter 1: the rest is estimated twice as long
    assert A.time_left([1], [2, 3, 4, 5], 2 * t[1]) == pytest.approx(2 * (t[2] + t[3] + t[4] + t[5]))
    assert A.time_left([1, 2, 3, 4, 5], [], 400.0) == 0.0
    assert A.time_left([], [9], 0.0) is None
