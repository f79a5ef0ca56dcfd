"""Slider ranges cannot produce invalid states: every explorer, every control pushed to each end of its
range (and each option of a choice), in turn and all together, redraws without an exception and shows
no NaN, inf or Python error text."""
import itertools
import re

import ipywidgets as W
import pytest

from conftest import EXAMPLE
from preflight import widgets
from preflight.chapters import advisor
from preflight.chapters import memory_plan as MP
from preflight.core.profile import load_profile
from preflight.reporting import charts

EXPLORERS = ["amdahl", "listing", "supply", "allreduce", "bubble", "failure", "interval", "memory", "layouts"]


def _explorers():
    prof = load_profile(EXAMPLE)
    mem = MP.add_plan_findings(__import__("preflight.core.findings", fromlist=["FindingSink"]).FindingSink(), prof)
    return {
        "amdahl": lambda: widgets.amdahl_explorer(0.09, 0.8, 1024),
        "listing": lambda: widgets.listing_explorer(10_000_000, 0.5, 8),
        "supply": lambda: widgets.supply_explorer(4000, 2000, 0.36),
        "allreduce": lambda: widgets.allreduce_explorer(7e9, 1024, "fp32", "InfiniBand HDR 200 Gb/s per NIC", 0.8,
                                                        0.09, 8, 450.0),
        "bubble": lambda: widgets.bubble_explorer(4, 8, "1f1b"),
        "failure": lambda: widgets.failure_explorer(1e-4, 128, 30),
        "interval": lambda: widgets.interval_explorer(60, 300, 1875, 10800, walltime_h=48, segments=2000),
        "memory": lambda: widgets.memory_explorer(mem["plan"], mem["capacity"], 8, 1024),
        "layouts": lambda: widgets.layout_explorer(prof, advisor.advise(prof)),
    }


def _ends(c):
    if isinstance(c, W.SelectionSlider):        # a range of stops: its two ends and its middle
        v = list(c._options_values)
        return [v[0], v[len(v) // 2], v[-1]]
    if isinstance(c, (W.Dropdown, W.ToggleButtons)):
        return list(c._options_values)          # a choice: each of its values
    if isinstance(c, W.Checkbox):
        return [False, True]
    if isinstance(c, W.FloatLogSlider):
        return [c.base ** c.min, c.base ** c.max]
    return [c.min, c.max]


BAD = re.compile(r"(?i:\bnan\b|\binf\b)|Traceback|\w+Error\b|Exception")


def _check(box, name, state):
    text = box.children[2].value
    assert not BAD.search(re.sub(r"<[^>]+>", " ", text)), (name, state, text[:300])
    assert box.children[3].value.startswith("<svg"), (name, state)


@pytest.mark.parametrize("name", EXPLORERS)
def test_chart_specs_pass_the_vega_lite_schema(name, monkeypatch):
    """Redraws skip altair's schema check (charts.VALIDATE, for speed); here every explorer's chart is
    built once with it, at the start and with every control at its far end."""
    monkeypatch.setattr(charts, "VALIDATE", True)
    box = _explorers()[name]()
    for c in box.children[1].children:
        c.value = _ends(c)[-1]
    _check(box, name, "far ends")


@pytest.mark.parametrize("name", EXPLORERS)
def test_every_control_at_every_end(name):
    try:
        box = _explorers()[name]()
    except TypeError as err:          # an explorer's signature changed: the test must follow
        pytest.fail(f"{name}: {err}")
    controls = list(box.children[1].children)
    start = [c.value for c in controls]
    for i, c in enumerate(controls):       # one control at a time
        for v in _ends(c):
            c.value = v
            _check(box, name, {i: v})
        c.value = start[i]
    corners = list(itertools.product(*[[_ends(c)[0], _ends(c)[-1]] for c in controls]))
    for corner in corners[:: max(1, len(corners) // 16)]:   # all together, up to 16 corners
        for c, v in zip(controls, corner):
            c.value = v
        _check(box, name, corner)
