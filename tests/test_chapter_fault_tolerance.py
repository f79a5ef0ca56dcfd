"""Chapter 5's plan findings on the example profile and on extreme but valid plans."""
import math

import pytest

from conftest import example_with, plan_findings
from preflight.chapters import fault_tolerance as C
from preflight.core.profile import parse_profile
from preflight.models import resilience as R


def _findings(**changes):
    return plan_findings(C.add_plan_findings, **changes)


def test_default_rate_is_llama3s():
    p, f = _findings()
    assert p["p_node_day"] == pytest.approx(R.LLAMA3_P_NODE_DAY, rel=1e-3)


def test_example_profile_numbers():
    p, f = _findings(cluster__node_failure_per_day=1e-4)  # the field report's scenario beside Llama 3's (the default)
    # 128 nodes at 1e-4: 1 - (1 - 1e-4)^128
    assert f["fault_tolerance/failure_prob_day"].value == pytest.approx(1 - (1 - 1e-4) ** 128)
    assert f["fault_tolerance/failure_prob_run"].value == pytest.approx(1 - (1 - 1e-4) ** (128 * 30))
    assert f["fault_tolerance/mtbf_h"].value == pytest.approx(24 / (128 * -math.log1p(-1e-4)))
    m_s = f["fault_tolerance/mtbf_h"].value * 3600
    assert f["fault_tolerance/checkpoint_interval_opt_s"].value == pytest.approx(R.daly_interval(60, m_s))
    assert f["fault_tolerance/checkpoint_interval_opt_s"].value == pytest.approx(math.sqrt(2 * 60 * m_s), rel=0.01)
    # the verdict's number is the extra waste of the plan's 3 h over the optimum, as its threshold says
    extra = f["fault_tolerance/checkpoint_interval_extra_waste"]
    assert extra.value == pytest.approx(p["waste_plan"] - p["waste_opt"]) and extra.unit == "fraction"
    assert extra.verdict == "pass" and extra.threshold.endswith("pass <= +1%, fail > +5%")
    # the plan checkpoints every 3 h: waste from Daly's model at 10800 s
    assert f["fault_tolerance/expected_waste"].value == pytest.approx(R.daly_waste(10800, 60, 300, m_s))
    assert f["fault_tolerance/expected_waste"].verdict == "pass"
    assert f["fault_tolerance/walltime_fit"].value == pytest.approx(10800 / (48 * 3600))
    assert "at least 15 allocations" in f["fault_tolerance/walltime_fit"].message
    assert p["waste_plan"] > p["waste_opt"]


def test_no_plan_interval_is_a_warning_and_uses_the_optimum():
    p, f = _findings(training__checkpoint_interval_s=None)
    assert f["fault_tolerance/checkpoint_interval_extra_waste"].verdict == "warn"
    assert f["fault_tolerance/checkpoint_interval_extra_waste"].value is None
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


def test_every_plan_finding_shows_the_llama3_rate_beside_the_profiles():
    p, f = _findings(cluster__node_failure_per_day=1e-4)  # the field report's scenario beside Llama 3's (the default)
    q = p["llama3"]
    assert q["p_node_day"] == R.LLAMA3_P_NODE_DAY and p["p_node_day"] == 1e-4
    assert q["mtbf_h"] == pytest.approx(49.49, abs=0.01) and p["mtbf_h"] == pytest.approx(1874.9, abs=0.1)
    for fid in ("failure_prob_day", "failure_prob_run", "mtbf_h", "checkpoint_interval_opt_s",
                "checkpoint_interval_extra_waste", "expected_waste",
                "walltime_fit"):
        assert "Llama 3's 3.8e-3 interruptions per node-day" in f[f"fault_tolerance/{fid}"].message, fid
    assert "49.5 h" in f["fault_tolerance/mtbf_h"].message
    assert "76.4 min" in f["fault_tolerance/checkpoint_interval_opt_s"].message      # Daly at 49.5 h, C = 60 s
    assert "exponential (memoryless)" in f["fault_tolerance/checkpoint_interval_opt_s"].message



def test_the_profiles_rate_decides_the_verdict():
    # a 15-minute write every 6 h: 4.2 % waste at 1e-4 (pass), 10.1 % at Llama 3's rate (warn)
    p, f = _findings(training__checkpoint_write_s=900.0, training__checkpoint_interval_s=6 * 3600.0,
                     cluster__node_failure_per_day=1e-4)
    waste = f["fault_tolerance/expected_waste"]
    assert waste.value == pytest.approx(p["waste_plan"]) == pytest.approx(0.0416, abs=1e-4)
    assert p["llama3"]["waste_plan"] == pytest.approx(0.1009, abs=1e-4)
    assert waste.verdict == "pass" and "verdict there: warn" in waste.message
    # and the other way round: a rate above Llama 3's fails on its own
    _, f = _findings(cluster__node_failure_per_day=0.05, training__checkpoint_write_s=900.0,
                     training__checkpoint_interval_s=6 * 3600.0)
    assert f["fault_tolerance/expected_waste"].verdict == "fail"
    assert "verdict there: warn" in f["fault_tolerance/expected_waste"].message


def test_the_fix_is_to_measure_the_rate_not_to_lower_it():
    _, f = _findings()
    assert "Replace the assumed cluster.node_failure_per_day with your site's measured rate" in \
        f["fault_tolerance/mtbf_h"].fix
    assert not any("lower the per-node rate" in x.fix.lower() for x in f.values())


def test_rates_table_puts_both_rates_side_by_side():
    p, _ = _findings(cluster__node_failure_per_day=1e-4)  # the field report's scenario beside Llama 3's (the default)
    t = C.rates_table(p).set_index("quantity")
    assert list(t.columns) == ["profile's rate", "Llama 3's rate"]
    # numbers as preflight.core.numfmt writes them everywhere: the rate as the chart's legend, shares in %
    assert t.loc["system MTBF"].tolist() == ["1,875 h", "49.5 h"]
    assert t.loc["optimal interval (Daly)"].tolist() == ["7.89 h", "76.4 min"]
    assert t.loc["per-node daily failure probability"].tolist() == ["1.0e-4", "3.8e-3"]
    assert t.loc["P(at least one failure per day)"].tolist() == ["1.27%", "38.4%"]
    assert t.loc["interval used", "profile's rate"] == "3 h"
    assert t.loc["waste verdict"].tolist() == ["pass", "pass"]


def test_checkpoint_cost_from_the_states_bytes_and_the_write_bandwidth():
    """C = bytes per parameter a checkpoint saves x params / aggregate write bandwidth: 7B with DeepSpeed
    (2 + 4 + 8 = 14 B/param: weights, fp32 master, Adam's m and v; no gradients) at 10 GB/s: 9.8 s. An
    explicit training.checkpoint_write_s overrides it."""
    from preflight.chapters import fault_tolerance as F
    from preflight.models import resilience as R

    assert R.checkpoint_seconds(7e9, "deepspeed", 10.0) == pytest.approx(9.8)
    assert R.checkpoint_seconds(7e9, "fsdp2", 10.0) == pytest.approx(8.4)
    d = example_with(cluster__checkpoint_write_GBps=10.0)
    del d["training"]["checkpoint_write_s"]
    C, how = F.checkpoint_cost(parse_profile(d))
    assert C == pytest.approx(9.8) and "14 B/param" in how
    C, how = F.checkpoint_cost(parse_profile(example_with(cluster__checkpoint_write_GBps=10.0)))
    assert C == 60 and how == "training.checkpoint_write_s"          # the example sets it: the override
    _, f = plan_findings(F.add_plan_findings, cluster__checkpoint_write_GBps=10.0)
    assert "fault_tolerance/checkpoint_write_s" in f


def test_queue_wait_after_requeues_is_waste():
    """30 days in 24 h allocations with 2 h in the queue after each: 29 requeues x 2 h = 58 h of 778."""
    from preflight.chapters import fault_tolerance as F
    from preflight.models import resilience as R

    w = R.queue_waste(7200, 30 * 86400, 24)
    assert w == pytest.approx(29 * 7200 / (30 * 86400 + 29 * 7200))
    base = F.plan(parse_profile(example_with()))
    queued = F.plan(parse_profile(example_with(cluster__queue_wait_s=7200, cluster__walltime_h=24)))
    assert queued["waste_plan"] > base["waste_plan"] + 0.05 and queued["R"] == base["R"] + 7200


def _stall_record(async_stall, async_hidden, sync_stall):
    rows = [{"method": "sync ckpt.save", "stall_s": sync_stall, "durable_s": sync_stall, "hidden_cost_s": 0.0,
             "total_cost_s": sync_stall},
            {"method": "async two-stage", "stall_s": async_stall, "durable_s": 1.0, "hidden_cost_s": async_hidden,
             "total_cost_s": async_stall + async_hidden, "inflight_slowdown": 1.4}]
    return {"rows": rows, "async_stall_ratio": async_stall / sync_stall, "config": {"state_MB": 20}}


@pytest.mark.parametrize("async_stall, hidden, sync, verdict", [
    (0.10, 0.47, 0.305, "fail"),     # the walk-through's case: less stall, more lost in slower steps
    (0.10, 0.02, 0.305, "pass"),
])
def test_async_save_verdict_agrees_with_its_chart(async_stall, hidden, sync, verdict):
    """The chapter's chart stacks stall and slower steps per method; the verdict judges that total."""
    r = _stall_record(async_stall, hidden, sync)
    chart = C.stall_chart_data(r).groupby("method")["ms"].sum()
    f = C._stall_finding(r)
    assert f["value"] == pytest.approx(chart["async two-stage"] / chart["sync ckpt.save"])
    assert f["verdict"] == verdict
    assert (f["value"] > 1) == (chart["async two-stage"] > chart["sync ckpt.save"])
    # an old record without the hidden cost: the stall alone, said so in the threshold
    old = {"rows": [{k: v for k, v in x.items() if k not in ("total_cost_s",)} for x in r["rows"]],
           "async_stall_ratio": r["async_stall_ratio"], "config": {}}
    for x in old["rows"]:
        x.pop("hidden_cost_s")
    assert C._stall_finding(old)["threshold"].startswith("async stall / sync stall")
