"""Stragglers (chapter 4): the expected maximum of N per-rank step times, checked by Monte Carlo, its
finding on the profile and its explorer."""
import pytest

from conftest import example_with, plan_findings
from preflight.chapters import load_balance as C
from preflight.models import stragglers as S


@pytest.mark.parametrize("n, exact", [(1, 0.0), (2, 0.5642), (8, 1.4236)])
def test_expected_max_of_normals_against_closed_forms(n, exact):
    # n = 2: 1/sqrt(pi) exactly; n = 8 from tables of normal order statistics (Harter 1961)
    assert S.expected_max_normal(n) == pytest.approx(exact, abs=2e-4)


@pytest.mark.parametrize("n", [8, 64, 1024])
def test_the_slowdown_agrees_with_a_monte_carlo_of_the_barrier(n):
    cv = 0.03
    sim = S.simulate_slowdown(n, cv, steps=4000, seed=7)
    assert sim == pytest.approx(S.slowdown(n, cv), abs=0.003)


def test_it_grows_with_n_and_the_sayings_asymptote_overstates():
    values = [S.expected_max_normal(2 ** k) for k in range(1, 15)]
    assert values == sorted(values)
    assert S.slowdown(1024, 0.02) == pytest.approx(1.065, abs=0.002)      # 2 % jitter: +6.5 % at 1,024 GPUs
    assert S.large_n(1024) > S.expected_max_normal(1024) > S.blom(1024) * 0.99
    with pytest.raises(ValueError, match="cv"):
        S.slowdown(8, 1.5)


def test_the_finding_is_judged_with_the_profiles_jitter_and_a_scenario_without():
    _, f = plan_findings(C.add_plan_findings)
    s = f["load_balance/straggler_slowdown"]
    assert s.verdict == "info" and s.value is None
    assert "1% -> +3.2%, 2% -> +6.5%, 5% -> +16.2%" in s.message and "Not judged (training.step_jitter_cv" in s.message
    _, f = plan_findings(C.add_plan_findings, training__step_jitter_cv=0.05)
    s = f["load_balance/straggler_slowdown"]
    assert s.verdict == "fail" and s.value == pytest.approx(S.slowdown(1024, 0.05) - 1)
    _, f = plan_findings(C.add_plan_findings, training__step_jitter_cv=0.005)
    assert f["load_balance/straggler_slowdown"].verdict == "pass"


def test_bad_jitter_is_refused_with_the_field_named():
    from preflight.core.profile import ProfileError, parse_profile

    with pytest.raises(ProfileError, match="training.step_jitter_cv"):
        parse_profile(example_with(training__step_jitter_cv=2))


def test_the_explorer_redraws_with_the_model():
    from preflight.widgets import straggler_explorer

    box = straggler_explorer(1024, 0.02)
    readout = box.children[2].value
    assert 'data-key="slowdown">1.065x' in readout and 'data-key="simulated">1.06' in readout
    n, cv = box.children[1].children
    cv.value = 0.05
    assert f'data-key="slowdown">{S.slowdown(1024, 0.05):.3f}x' in box.children[2].value
