"""The Amdahl explorer: the readout and the chart follow the sliders with the library's numbers."""
import re

import pytest

from preflight.models.scaling import amdahl_ceiling, amdahl_speedup, gustafson_speedup, serial_fraction
from preflight.widgets import amdahl_explorer


def _readout(box) -> dict:
    return dict(re.findall(r'data-key="(\w+)">([^<]+)<', box.children[2].value))


def test_amdahl_explorer_follows_sliders():
    box = amdahl_explorer(0.0136, 0.1035, 1024)
    ts, tc, n = box.children[1].children
    assert (ts.value, tc.value, n.value) == (0.0136, 0.1035, 10)   # starts exactly where asked
    r = _readout(box)
    assert r["n"] == "1024"
    assert r["speedup"] == f"{amdahl_speedup(0.0136, 0.1035, 1024):.2f}x"
    assert r["ceiling"] == f"{amdahl_ceiling(0.0136, 0.1035):.2f}x"
    svg_before = box.children[3].value
    assert svg_before.startswith("<svg")

    n.value = 11
    ts.value = ts.value + ts.step
    r = _readout(box)
    assert r["n"] == "2048"
    assert r["speedup"] == f"{amdahl_speedup(ts.value, tc.value, 2048):.2f}x"
    assert r["ceiling"] == f"{amdahl_ceiling(ts.value, tc.value):.2f}x"
    assert r["gustafson"] == f"{gustafson_speedup(serial_fraction(ts.value, tc.value), 2048):.1f}x"
    assert box.children[3].value != svg_before
    assert f"ceiling {amdahl_ceiling(ts.value, tc.value):.3g}x" in box.children[3].value


def test_no_serial_part_is_unbounded():
    box = amdahl_explorer(0.0, 1.0, 8)
    assert _readout(box)["ceiling"] == "unbounded"
    assert _readout(box)["speedup"] == "8.00x"


@pytest.mark.parametrize("ts,tc", [(0.09, 0.8), (5.0, 0.001)])
def test_slider_ranges_contain_start(ts, tc):
    box = amdahl_explorer(ts, tc, 64)
    for s, v in zip(box.children[1].children[:2], (ts, tc)):
        assert s.min <= s.value <= s.max and s.value == pytest.approx(v)
