"""Long cells say what they measure and about how long before they start, and how long they took."""
import importlib
import pkgutil

import preflight.bench
from preflight.core.records import Method
from preflight.harness import progress

RECORDED_ONLY = {"pipeline", "elastic_shrink"}      # read from --results only: nothing is measured here


def _bench_methods() -> set[str]:
    names = set()
    for mod in pkgutil.iter_modules(preflight.bench.__path__):
        m = importlib.import_module(f"preflight.bench.{mod.name}")
        names |= {v.name for v in vars(m).values() if isinstance(v, Method)}
    return names


def test_every_live_measurement_is_announced_with_a_time():
    live = {n for n in _bench_methods() if n not in RECORDED_ONLY and not n.startswith("workload_")}
    assert live and live <= set(progress.TYPICAL_S), live - set(progress.TYPICAL_S)
    assert not RECORDED_ONLY & set(progress.TYPICAL_S)
    for name in live:
        line = progress.describe(name)
        assert line.startswith("Measuring ") and "about " in line and " s on a 2-core CPU" in line, line


def test_describe_quick_gpu_and_workload():
    assert "quick sizes" in progress.describe("loadtune", quick=True)
    assert "seconds on one GPU" in progress.describe("loadtune", gpu=True)
    assert "your model" in progress.describe("workload_fusion") and "depends on the model" in progress.describe(
        "workload_fusion")
    assert not progress.announced("pipeline") and progress.announced("workload_resume")


def test_started_and_finished_print_one_line_each(capsys):
    t0 = progress.started("overlap")
    assert progress.finished("overlap", t0) >= 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("Measuring DDP on 2 ranks") and out[1].startswith("... overlap: ")
    assert progress.started("pipeline") is None and progress.finished("pipeline", None) is None
    assert capsys.readouterr().out == ""


def test_steps_yields_everything_and_draws_no_bar_outside_ipython(capsys):
    assert list(progress.steps(range(5), "settings")) == [0, 1, 2, 3, 4]
    assert capsys.readouterr().out == ""
    html = progress.bar_html(3, 12, "loader settings", "4 s")
    assert '<progress value="3" max="12"' in html and "loader settings: 3/12 - 4 s" in html
    assert "<script" not in html


def test_a_live_measurement_announces_itself(capsys):
    """``Chapter.measurement`` prints the line before the measurement runs and the time after it."""
    from conftest import EXAMPLE
    from preflight.runner.chapter import start

    ch = start("data_pipeline", EXAMPLE, None, plan_only=False, quick=False)
    order = []
    res = ch.measurement(Method("loadtune", 1), lambda: order.append(capsys.readouterr().out) or {"x": 1})
    assert res.results == {"x": 1}
    assert order[0].rstrip().endswith("Measuring the loader tuner: every num_workers x prefetch_factor x pin_memory "
                                      "against the device's rate (about 15 s on a 2-core CPU) ...") or \
        "seconds on one GPU" in order[0]
    assert capsys.readouterr().out.startswith("... loadtune: ")
