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
    assert r["gustafson_eff"] == f"{gustafson_speedup(serial_fraction(ts.value, tc.value), 2048) / 2048:.1%}"
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


def _controls(box) -> dict:
    return {c.description: c for c in box.children[1].children}


def test_allreduce_calculator_reproduces_the_field_case_and_follows_the_sliders():
    from preflight.models import comm
    from preflight.widgets import allreduce_explorer

    def plan(dp, dtype, tp=1, nics=None):       # the library's plan at the sliders' position
        return comm.allreduce_plan(7e9, dp, dtype, tp, gpus_per_node=8, intra_node_GBps=450.0,
                                   inter_node_Gbps=200.0, nics_per_node=nics, compute_s=0.8, serial_s=0.09)

    box = allreduce_explorer(7e9, 1024, "fp32", "InfiniBand HDR 200 Gb/s per NIC", 0.8, 0.09, 8, 450.0)
    r = _readout(box)
    assert r["bytes"] == "55.9 GB" and r["dp"] == "1,024"
    assert r["time_s"] == f"{plan(1024, 'fp32').time_s:.3g} s" == "0.3 s"
    assert r["flat_s"] == f"{plan(1024, 'fp32').flat_s:.3g} s" == "2.26 s"
    assert r["ratio"] == "0.38x" == f"{plan(1024, 'fp32').ratio:.2f}x"
    assert r["eff_no"] == f"{plan(1024, 'fp32').efficiency_no_overlap:.1%}"
    assert r["eff_ov"] == f"{plan(1024, 'fp32').efficiency_full_overlap:.1%}"
    assert r["link"] == plan(1024, "fp32").link_why and "128 nodes" in r["link"]
    c = _controls(box)
    c["NICs per node"].value = 1               # one NIC for the node: the field report's arithmetic
    r = _readout(box)
    assert r["time_s"] == r["flat_s"] == f"{plan(1024, 'fp32', nics=1).time_s:.3g} s" == "2.26 s"
    c["NICs per node"].value = 8
    c["gradient dtype"].value = "bf16"
    r = _readout(box)
    assert r["bytes"] == "28 GB"
    assert r["time_s"] == f"{plan(1024, 'bf16').time_s:.3g} s"
    c["log2 D (DP ranks)"].value = 3          # 8 ranks: one node, the ring runs on NVLink
    r = _readout(box)
    nvlink_ring = 450.0 * comm.RING_NVLINK_SHARE          # 370 GB/s busbw of the 450 GB/s line rate
    assert r["time_s"] == f"{plan(8, 'bf16').time_s:.3g} s" == f"{comm.ring_allreduce_time(14e9, 8, nvlink_ring, 5e-6):.3g} s"
    assert r["flat_s"] == r["time_s"]
    # with tp = 2 the same 8 ranks fill two nodes: the widget follows the plan's link rule
    box = allreduce_explorer(7e9, 8, "bf16", "InfiniBand HDR 200 Gb/s per NIC", 0.8, 0.09, 8, 450.0, tp=2)
    r = _readout(box)
    assert plan(8, "bf16", tp=2).link == "inter-node"
    assert r["time_s"] == f"{plan(8, 'bf16', tp=2).time_s:.3g} s" and r["bytes"] == "12.2 GB"


def test_listing_and_supply_explorers_start_exactly_and_agree_with_the_formulas():
    from preflight.core.numfmt import seconds
    from preflight.models import data as M
    from preflight.widgets import listing_explorer, supply_explorer

    box = listing_explorer(10_000_000, 0.5, 8)
    c = _controls(box)
    assert c["files"].value == pytest.approx(1e7) and c["stat per file (ms)"].value == pytest.approx(0.5)
    assert _readout(box)["listing_s"] == "5,000 s (83.3 min)"      # as the finding writes it
    c["stat per file (ms)"].value = c["stat per file (ms)"].value * 2
    listing = M.listing_time_s(10_000_000, "lustre", c["stat per file (ms)"].value / 1e3)
    assert _readout(box)["listing_s"] == seconds(listing)
    assert _readout(box)["listing_s"] == "10,000 s (2.78 h)"

    box = supply_explorer(900.0, 1000.0, measured_idle=0.12)
    r = _readout(box)
    assert r["headroom"] == "0.90x" and r["idle"] == "10.0%" and r["verdict"] == "fail"
    assert r["measured_idle"] == "12.0%"
    assert r["chapter"] == "fail"           # the chapter's verdict at the starting point: supply and measured idle
    svg = box.children[3].value            # the 1.2x line the title names is drawn (issue 19)
    assert re.search(r'aria-label="supply / consumption: 1.2"[^>]*stroke="#c62828"', svg)


def test_bubble_explorer_says_what_it_adjusted_for_interleaving():
    """Interleaved at v=1, m=16, p=6 runs as v=2, m=18: the explorer says so and why, and counts whole
    chunk activations, never "8.5" micro-batches (issue 19)."""
    from preflight.models import pipeline as P
    from preflight.widgets import bubble_explorer
    from preflight.widgets.load_balance import interleaved_settings

    assert interleaved_settings(6, 18, 2) == (18, 2, "")
    m, v, why = interleaved_settings(6, 16, 1)
    assert (m, v) == (18, 2) and "v=2 chunks, not 1" in why and "m=18, not 16" in why
    box = bubble_explorer(6, 16, "interleaved", 1)
    r = _readout(box)
    assert "m=18, not 16" in r["adjusted"].replace("&#x27;", "'")
    assert r["bubble"] == f"{P.bubble_fraction(6, 18, 2):.1%}"
    held = P.activation_memory_microbatches(6, 18, "interleaved", 0, v=2)
    assert r["activations"].startswith(f"{held * 2:.0f} (") and "." not in r["activations"].split(" ")[0]
    assert "adjusted" in box.children[3].value
    box = bubble_explorer(4, 8, "1f1b", 1)
    assert "adjusted" not in _readout(box) and _readout(box)["activations"] == "4"


def test_layout_explorer_reranks_with_the_advisors_model_and_filters():
    """Chapter 1's layout advisor: it starts at advise()'s ranking; the efficiency slider re-times every
    fitting layout with the same step model (advisor.at_efficiency); the limits filter that ranking."""
    import html

    from conftest import EXAMPLE
    from preflight.chapters import advisor
    from preflight.core.profile import load_profile
    from preflight.widgets import layout_explorer

    prof = load_profile(EXAMPLE)
    result = advisor.advise(prof)
    box = layout_explorer(prof, result)
    eff, max_pp, zero3 = box.children[1].children
    best = result["candidates"][0]
    r = _readout(box)
    assert r["best"] == advisor.label(best) and r["tokens"] == f"{best['tokens_per_s_per_gpu']:,.0f}"
    assert r["count"] == str(result["fitting"])
    assert html.unescape(r["own"]).startswith("does not fit its memory")        # the example's plan: 169 %
    eff.value = 0.3
    slow = advisor.at_efficiency(prof, result, 0.3)
    assert _readout(box)["tokens"] == f"{slow[0]['tokens_per_s_per_gpu']:,.0f}"
    assert slow[0]["tokens_per_s_per_gpu"] < best["tokens_per_s_per_gpu"]
    assert slow[0]["memory_per_gpu_bytes"] == next(c for c in result["candidates"] if advisor.label(c) ==
                                                   advisor.label(slow[0]))["memory_per_gpu_bytes"]
    zero3.value = False
    max_pp.value = 1
    allowed = [c for c in slow if c["zero_stage"] < 3 and c["pp"] == 1]
    r = _readout(box)
    assert r["best"] == advisor.label(allowed[0]) and r["count"] == str(len(allowed))
    assert "predicted tokens/s per GPU" in box.children[3].value


def test_advisor_table_marks_the_profiles_plan():
    from conftest import EXAMPLE
    from preflight.chapters import advisor
    from preflight.core.profile import load_profile

    prof = load_profile(EXAMPLE)
    cands = advisor.advise(prof)["candidates"]
    t = advisor.table(prof, cands, top=3)
    assert len(t) == 4 and list(t["rank"][:3]) == ["1", "2", "3"]
    mine = t.iloc[3]
    assert mine["layout"].endswith("(the profile's plan)") and "does not fit" in mine["memory per GPU"]
    assert not advisor.own_plan(prof, cands)["fits"] and mine["rank"] == "— (does not fit)"     # not ranked
