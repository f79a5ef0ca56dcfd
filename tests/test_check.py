"""``python -m preflight check``: the plan-only gate. README's commands as written, the exit codes of
the gate, bad input (exit 2, the field named), no torch import, and the 2 s budget."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import yaml

from conftest import EXAMPLE, REPO, cli_cpu_seconds, example_with, run_cli


def readme_check_commands() -> list[str]:
    """The bash block of README's "A gate before the job" section: its command lines, comments removed."""
    text = (REPO / "README.md").read_text()
    section = text.split("## A gate before the job", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```bash\n(.*?)```", section, re.S)[0]
    return [re.sub(r"\s+#.*$", "", ln).strip() for ln in block.splitlines() if ln.strip()]


def test_readme_commands_run_as_written():
    cmds = readme_check_commands()
    assert len(cmds) == 3
    for cmd in cmds:
        args = cmd.split()
        assert args[:3] == ["python", "-m", "preflight"], cmd
        r = run_cli(*args[3:])
        want = 1 if "--fail-on fail" in cmd else 0      # the example fails (memory, small files, padding)
        assert r.returncode == want, (cmd, r.stdout, r.stderr)
        if "--json" in cmd:
            data = json.loads(r.stdout)
            assert {f["chapter"] for f in data["findings"]} == {1, 2, 3, 4, 5}
        else:
            assert "chapter 1 baseline" in r.stdout and "FAIL  baseline/memory_fits" in r.stdout


def test_gate_levels_and_a_passing_plan(tmp_path):
    from preflight.core.profile import parse_profile
    from preflight.runner import check

    f = check.plan_findings(parse_profile(example_with()), EXAMPLE)
    assert check.gate(f, None) == 0 and check.gate(f, "fail") == 1 and check.gate(f, "warn") == 1
    verdicts = {x["id"]: x["verdict"] for fs in f.values() for x in fs}
    assert verdicts["baseline/memory_fits"] == "fail"
    # The same plan with ZeRO-1: memory passes; other fails remain (small files, padding).
    z1 = check.plan_findings(parse_profile(example_with(training__zero_stage=1)), EXAMPLE)
    assert {x["id"]: x["verdict"] for fs in z1.values() for x in fs}["baseline/memory_fits"] == "pass"
    # warn-only plan: fix the fails, the warn level still trips
    # (the warn: 2 % per-rank jitter over 1,024 ranks costs 6.5 % of each step, load_balance/straggler_slowdown)
    d = example_with(training__zero_stage=1, data__files=1000, data__mean_file_kB=256_000, data__length_sigma=0,
                     training__step_jitter_cv=0.02)
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(d))
    r = run_cli("check", p, "--fail-on", "fail")
    assert r.returncode == 0, r.stdout
    assert run_cli("check", p, "--fail-on", "warn").returncode == 1


def test_bad_profile_exit_2_names_the_field(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(example_with(training__tp=3)))
    r = run_cli("check", p)
    assert r.returncode == 2 and "training.tp" in r.stderr and not r.stdout
    r = run_cli("check", tmp_path / "missing.yaml")
    assert r.returncode == 2 and "not found" in r.stderr
    r = run_cli("check", EXAMPLE, "--fail-on", "fial")
    assert r.returncode == 2 and "did you mean 'fail'" in r.stderr


def test_no_torch_and_within_two_seconds():
    code = ("import sys, contextlib, io\nfrom preflight.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(['check', sys.argv[1]])\n"
            "print('torch' in sys.modules, 'matplotlib' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code, str(EXAMPLE)], capture_output=True, text=True, cwd=REPO)
    assert r.stdout.split() == ["False", "False"], r.stderr
    best = float("inf")
    for _ in range(3):                  # warm file cache; best of three
        r, cpu_s = cli_cpu_seconds("check", EXAMPLE)
        assert r.returncode == 0, r.stderr
        best = min(best, cpu_s)
    # The budget in CPU seconds: the work done, which another job on the cores barely changes (wall
    # time did: 2 s was passed beside a loaded suite). Idle, they agree: 1.65-1.93 s wall, 1.75-2.0 CPU-s on
    # 2026-12-02, a box ~1.5x slower than the day of the 1.18 s measured before.
    assert best < 2.0, f"check used {best:.2f} CPU-s (budget 2 s)"
