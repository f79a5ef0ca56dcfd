"""Predict-then-measure exercises: grading, hidden answers, every chapter's questions on real profiles."""
import json
import math

import pytest

from conftest import EXAMPLE, REPO
from preflight.chapters import exercises as X
from preflight.chapters.registry import CHAPTERS as REGISTRY
from preflight.exercises import Exercise, check, grade
from preflight.profile import load_profile

CHAPTERS = {c.stem: getattr(X, c.name) for c in REGISTRY}       # 01_baseline: X.baseline, ...


def test_grade():
    assert grade(27, 27.27)[0] == "close"
    assert grade(9.4, 27.27, rel_tol=0.15)[0] == "far off"          # the popular wrong bubble formula
    verdict, factor = grade(50, 100, rel_tol=0.5, log=True)
    assert verdict == "off" and factor == pytest.approx(2.0)
    assert grade(1000, 1, log=True)[0] == "far off"
    with pytest.raises(ValueError, match="positive"):
        grade(-1, 5, log=True)
    with pytest.raises(ValueError, match="finite"):
        grade(float("nan"), 5)


def test_answer_hidden_until_predicted():
    calls = []
    ex = Exercise("k", "q?", "x", lambda: calls.append(1) or 4.0, "because")
    assert check(ex, None) == {"revealed": False} and calls == []      # not even computed
    assert check(ex, "four")["error"] == "not a number"
    shown = check(ex, 4.5)
    assert shown["revealed"] and shown["answer"] == 4.0 and shown["verdict"] == "close"
    assert check(ex, None, reveal=True)["answer"] == 4.0


@pytest.mark.parametrize("changes", [{}, {"cluster": {"nodes": 1, "gpus_per_node": 1}},
                                     {"cluster": {"node_failure_per_day": 0.0}},
                                     {"training": {"grad_dtype": "bf16", "tp": 8}}])
def test_every_chapter_has_answerable_questions(changes, tmp_path):
    import yaml

    d = yaml.safe_load(EXAMPLE.read_text())
    for section, values in changes.items():
        d[section].update(values)
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(d))
    prof = load_profile(p)
    for name, make in CHAPTERS.items():
        exs = make(prof)
        assert len(exs) >= 2 or (name == "05_fault_tolerance" and changes.get("cluster", {}).get("node_failure_per_day") == 0)
        for ex in exs.values():
            a = ex.answer()
            assert math.isfinite(a) and a >= 0, (name, ex.key, a)


def test_example_answers():
    prof = load_profile(EXAMPLE)
    assert X.load_balance(prof)["bubble"].answer() == pytest.approx(300 / 11)
    assert X.load_balance(prof)["bubble_m"].answer() == 28
    assert X.fault_tolerance(prof)["day"].answer() == pytest.approx(9.517, abs=0.01)
    assert X.communication(prof)["volume"].answer() == pytest.approx(2 * 7e9 * 4 * 1023 / 1024 / 1e9)
    assert X.baseline(prof)["model_states"].answer() == pytest.approx(16 * 7e9 / 2 ** 30)
    assert "fusion" in X.baseline(prof, fusion_speedup=1.3)


@pytest.mark.parametrize("name", CHAPTERS)
def test_each_notebook_ends_with_exercises(name):
    nb = json.loads((REPO / "playbook" / f"{name}.ipynb").read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    asks = [c for c in code if "ask(EX[" in c]
    checks = [c for c in code if "check(EX[" in c]
    assert 2 <= len(asks) == len(checks) <= 3
    for a in asks:
        assert "prediction = None" in a
