"""Chapter 5's plan findings on the example profile and on extreme but valid plans."""
import math

import pytest

from conftest import plan_findings
from preflight.chapters import fault_tolerance as C
from preflight.models import resilience as R


def _findings(**changes):
    return plan_findings(C.add_plan_findings, **changes)


def test_example_profile_numbers():
    p, f = _findings()
    # 128 nodes at 1e-4: 1 - (1 - 1e-4)^128
    assert f["fault_tolerance/failure_prob_day"].value == pytest.approx(1 - (1 - 1e-4) ** 128)
    assert f["fault_tolerance/failure_prob_run"].value == pytest.approx(1 - (1 - 1e-4) ** (128 * 30))
    assert f["fault_tolerance/mtbf_h"].value == pytest.approx(24 / (128 * -math.log1p(-1e-4)))
    m_s = f["fault_tolerance/mtbf_h"].value * 3600
    assert f["fault_tolerance/checkpoint_interval_s"].value == pytest.approx(R.daly_interval(60, m_s))
    assert f["fault_tolerance/checkpoint_interval_s"].value == pytest.approx(math.sqrt(2 * 60 * m_s), rel=0.01)
    # the plan checkpoints every 3 h: waste from Daly's model at 10800 s
    assert f["fault_tolerance/expected_waste"].value == pytest.approx(R.daly_waste(10800, 60, 300, m_s))
    assert f["fault_tolerance/expected_waste"].verdict == "pass"
    assert f["fault_tolerance/walltime_fit"].value == pytest.approx(10800 / (48 * 3600))
    assert "at least 15 allocations" in f["fault_tolerance/walltime_fit"].message
    assert p["waste_plan"] > p["waste_opt"]


def test_no_plan_interval_is_a_warning_and_uses_the_optimum():
    p, f = _findings(training__checkpoint_interval_s=None)
    assert f["fault_tolerance/checkpoint_interval_s"].verdict == "warn"
    assert p["interval_s"] == p["daly_s"]
    assert f["fault_tolerance/expected_waste"].value == pytest.approx(p["waste_opt"])


def test_interval_longer_than_walltime_fails():
    _, f = _findings(training__checkpoint_interval_s=60 * 3600.0)
    assert f["fault_tolerance/walltime_fit"].verdict == "fail"
    assert f["fault_tolerance/walltime_fit"].value == pytest.approx(60 / 48)


def test_flaky_large_cluster_fails_on_waste():
    # 10,000 nodes at 1e-3: MTBF ~ 2.4 h; a 30-minute write at a 3 h interval wastes a lot
    _, f = _findings(cluster__nodes=10_000, cluster__node_failure_per_day=1e-3, training__checkpoint_write_s=1800.0,
                     training__checkpoint_interval_s=3 * 3600.0)
    assert f["fault_tolerance/mtbf_h"].value == pytest.approx(2.4, rel=0.01)
    assert f["fault_tolerance/expected_waste"].verdict == "fail"


@pytest.mark.parametrize("changes", [
    {"cluster__node_failure_per_day": 0.0},
    {"cluster__node_failure_per_day": 0.0, "training__checkpoint_write_s": 0.0, "training__checkpoint_interval_s": None},
    {"cluster__nodes": 1, "cluster__gpus_per_node": 1},
    {"cluster__nodes": 100_000, "cluster__node_failure_per_day": 0.5},
    {"training__checkpoint_write_s": 0.0, "training__checkpoint_interval_s": None},
])
def test_extreme_but_valid_plans_give_finite_findings(changes):
    _, f = _findings(**changes)
    for fid, x in f.items():
        assert x.value is None or math.isfinite(x.value), fid
        assert "nan" not in x.message.lower(), (fid, x.message)
