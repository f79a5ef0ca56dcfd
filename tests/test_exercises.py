"""Predict-then-measure exercises: grading, hidden answers, every chapter's questions on real profiles."""
import json
import math
import re

import pytest

from conftest import EXAMPLE, REPO
from preflight.chapters import exercises as X
from preflight.chapters.predict import Exercise, check, feedback, grade
from preflight.chapters.registry import CHAPTERS as REGISTRY
from preflight.core.profile import load_profile

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
    hidden = feedback(ex, None)
    assert not hidden.revealed and hidden.answer is None and calls == []      # not even computed
    assert feedback(ex, "four").problem == "not a number"
    shown = feedback(ex, 4.5)
    assert shown.revealed and shown.answer == 4.0 and shown.verdict == "close"
    assert feedback(ex, None, reveal=True).answer == 4.0
    assert "4.5 x is **close**" in shown.text and "**Answer: 4 x.** because" in shown.text


def test_check_shows_one_clean_line(capsys, monkeypatch):
    """check() shows one line of feedback and returns None: the cell prints no raw dict after it."""
    import preflight.chapters.predict as E

    shown = []
    monkeypatch.setattr(E, "_show", shown.append)
    ex = Exercise("k", "q?", "GB", lambda: 123456.789, "because", log=True)
    for prediction, reveal in ((None, False), (None, True), (1e5, False), ("x", False), (-1, False)):
        assert check(ex, prediction, reveal) is None
    assert len(shown) == 5
    for line in shown:
        assert "\n" not in line and "{" not in line and "revealed" not in line, line
    assert "123,457 GB" in shown[1] and "e+" not in shown[1]          # numfmt, not 1.235e+05


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
    assert X.load_balance(prof)["bubble"].answer() == pytest.approx(500 / 13)            # p=6, m=8
    assert X.load_balance(prof)["bubble_m"].answer() == 46                                # m > 9 (p-1)
    small = X.week_nodes(prof.cluster.node_failure_per_day)
    assert small == 19 and X.fault_tolerance(prof)["day"].answer() == pytest.approx(100 * (1 - (1 - 3.78e-3) ** (small * 7)))
    assert X.communication(prof)["volume"].answer() == pytest.approx(2 * 7e9 * 2 * 2047 / 2048 / 1e9)
    assert X.baseline(prof)["model_states"].answer() == pytest.approx((2 + 4 + 12 / 8) * 7e9 / 2 ** 30)   # fp32 grads
    assert X.baseline(prof)["amdahl"].answer() == pytest.approx(0.845 / (0.045 + 0.8 / 256))
    assert X.data_pipeline(prof)["listing"].answer() == 120_000                          # 60 s / 0.5 ms
    assert "fusion" in X.baseline(prof, fusion_speedup=1.3)
    with pytest.raises(ValueError, match="not measured"):
        X.fusion().answer()                  # asked before the measurement; checked with it


def _near(x, shown, rel=0.03):
    return [s for s in shown if s and abs(x - s) <= rel * abs(s)]


@pytest.mark.parametrize("changes", [{}, {"training": {"pp": 4, "microbatches": 8}},
                                     {"training": {"pp": 2, "microbatches": 16, "grad_dtype": "bf16"}},
                                     {"cluster": {"nodes": 1000}}])
def test_no_exercise_asks_what_its_chapter_shows(changes, tmp_path):
    """Each answer differs from the numbers its chapter prints before the question (issue 19: the listing
    time, the all-reduce volume, 3/11, 9.5 % and the Daly interval were all shown, then asked)."""
    import yaml

    from preflight.chapters import communication as CC
    from preflight.chapters import data_pipeline as CD
    from preflight.chapters import fault_tolerance as CF
    from preflight.core.findings import FindingSink
    from preflight.models import pipeline as P
    from preflight.models import resilience as R

    d = yaml.safe_load(EXAMPLE.read_text())
    for section, values in changes.items():
        d[section].update(values)
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(d))
    prof = load_profile(p)
    t = prof.training

    listing = CD.listing_table(prof)
    assert X.data_pipeline(prof)["listing"].answer() not in set(listing.select_dtypes("number").to_numpy().ravel())

    plan = CC.plan(prof)
    ex = X.communication(prof)
    # (bf16 bytes sent = 2 x the bf16 buffer = the fp32 buffer S the chapter shows: that takes the formula to see)
    assert not _near(ex["volume"].answer(), [plan["bytes_per_rank"] / 1e9])
    assert not _near(ex["time"].answer(), [plan["time_s"], plan["flat_s"]])

    shown = {(q, m) for q in X.GRID_P for m in X.GRID_M} | {(t.pp, t.microbatches) if t.pp > 1 else (4, 8)}
    asked = X.asked_pipeline(prof)
    assert asked not in shown
    bubbles = [100 * P.bubble_fraction(q, m) for q, m in shown]
    assert not _near(X.load_balance(prof)["bubble"].answer(), bubbles, rel=0.01)

    p5 = CF.add_plan_findings(FindingSink(), prof)
    ex = X.fault_tolerance(prof)
    probs = [100 * v for v in (p5["p_day"], p5["p_run"], p5["llama3"]["p_day"], p5["llama3"]["p_run"],
                               R.failure_prob(1e-4, 1000, 1.0))]
    assert not _near(ex["day"].answer(), probs, rel=0.01)
    assert not _near(ex["interval"].answer(), [p5["daly_s"] / 3600, p5["llama3"]["daly_s"] / 3600])


@pytest.mark.parametrize("name", CHAPTERS)
def test_each_notebook_ends_with_exercises(name):
    nb = json.loads((REPO / "playbook" / f"{name}.ipynb").read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    asks = [c for c in code if "ask(EX[" in c]
    checks = [c for c in code if "check(EX[" in c]
    assert 2 <= len(asks) == len(checks) <= 3
    for a in asks + [c for c in code if "ask(X." in c]:
        assert re.search(r"^prediction\w* = None", a, re.M), a
    # predicted before the sliders that could answer it, checked after them
    first_ask = next(i for i, c in enumerate(code) if "ask(EX[" in c)
    explorers = [i for i, c in enumerate(code) if "_explorer(" in c and "display(" in c]
    first_check = next(i for i, c in enumerate(code) if "check(EX[" in c)
    assert explorers and first_ask < explorers[0] and first_check > max(i for i in explorers if i < first_check)
    for c in code:       # check() returns None: no cell ends on an expression that prints a raw value
        last = c.rstrip().splitlines()[-1] if c.strip() else ""
        assert not last.startswith("feedback("), c


def test_fusion_is_predicted_before_it_is_measured():
    nb = json.loads((REPO / "playbook" / "01_baseline.ipynb").read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    ask_at = next(i for i, c in enumerate(code) if "ask(X.fusion(" in c)
    measure_at = next(i for i, c in enumerate(code) if "measure_fusion(" in c)
    check_at = next(i for i, c in enumerate(code) if "check(X.fusion(" in c)
    assert ask_at < measure_at <= check_at
