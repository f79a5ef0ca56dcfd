"""The shared number formatting (``preflight.core.numfmt``): what the report, the comparison, the charts
and the sliders print for a number."""
from __future__ import annotations

import pytest

from preflight.core import numfmt as N


def test_sci_is_short():
    assert N.sci(1e-4) == "1.0e-4" and N.sci(0.00378, 3) == "3.78e-3" and N.sci(0) == "0"
    assert N.sci(2.5e-7, 3) == "2.5e-7" and N.sci(1e-4, 3) == "1.0e-4"       # trailing zeros go, one stays


@pytest.mark.parametrize("x, text", [
    (1875.4, "1,875"), (78.14, "78.1"), (0.4261, "0.426"), (0, "0"), (2e-4, "2.0e-4"),
    (float("inf"), "unbounded"), (float("nan"), "—"), (-250, "-250"),
])
def test_num_three_significant_digits_commas_above_100(x, text):
    assert N.num(x) == text


def test_pct_keeps_digits_and_never_rounds_to_certainty():
    assert [N.pct(x) for x in (0.00426, 0.0952, 0.0027, 0.6, 1e-6, 0.9999, 1.0, 0.0)] == [
        "0.426%", "9.52%", "0.270%", "60.0%", "<0.001%", ">99.9%", "100%", "0%"]
    assert N.pct(float("nan")) == "—"


def test_duration_picks_the_unit_that_fits():
    assert [N.duration(s) for s in (45, 3220, 28460, 48 * 3600, 6.75e6, 8.6e10)] == [
        "45 s", "53.7 min", "7.91 h", "48 h", "78.1 d", "2,725 years"]
    assert N.duration(float("inf")) == "unbounded" and N.duration(float("nan")) == "—"


def test_decimal_and_binary_bytes():
    assert N.gb(55.9e9) == "55.9 GB" and N.gb(2e9) == "2 GB"
    assert N.gib(80 * 2**30) == "80.0 GiB" and N.gib(1234.56 * 2**30) == "1,234.6 GiB"
    assert N.GiB == 1024**3


def test_finding_values_in_their_unit():
    assert N.fmt_value(None, "s") == "n/a"
    assert N.fmt_value(0.684, "fraction") == "68.4%"
    assert N.fmt_value(3.21, "x") == "3.21x"
    assert N.fmt_value(55.9e9, "bytes") == "55.9 GB"
    assert N.fmt_value(1.0, "bool") == "yes" and N.fmt_value(0.0, "bool") == "no"
    assert N.fmt_value(5000, "s") == "5,000 s (83.3 min)" and N.fmt_value(0.5, "s") == "0.5 s"
    assert N.fmt_value(7, "") == "7"


@pytest.mark.parametrize("value, unit, text", [
    # no scientific notation between 1e-3 and 1e6, whatever the unit
    (3.087e5, "tokens/s", "308,700 tokens/s"), (2048, "x", "2,048x"), (1.4e10, "bytes", "14 GB"),
    (1.4e13, "bytes", "14,000 GB"), (0.00457, "s", "0.00457 s"),
    # shares, signed shares, shares above one, probabilities: percent
    (4.571e-05, "fraction", "0.00457%"), (-0.0541, "fraction", "-5.41%"), (1.5, "fraction", "150%"),
    (0.0127, "probability", "1.27%"), (0.0, "fraction", "0%"),
    # durations: seconds as thresholds state them, the readable unit beside them from 10 min up
    (28419.8, "s", "28,420 s (7.89 h)"), (599, "s", "599 s"), (1874.9, "h", "1,875 h (78.1 d)"), (3.0, "h", "3 h"),
    # a plain quotient has no unit word
    (9.4756, "ratio", "9.48"),
])
def test_finding_values_read_as_people_write_them(value, unit, text):
    assert N.fmt_value(value, unit) == text


def test_memory_in_binary_units_data_in_decimal():
    """GiB for memory (what the memory plan and its chart count), GB for data moved or stored."""
    mem = {"id": "baseline/memory_per_gpu", "value": 239510985932.8, "unit": "bytes"}
    assert N.fmt_finding(mem) == "223.1 GiB" == N.gib(mem["value"])
    assert N.fmt_finding({"id": "baseline/peak_memory", "value": 2741576.0, "unit": "bytes"}) == "2.61 MiB"
    assert N.fmt_finding({"id": "communication/allreduce_bytes_per_rank", "value": 55.9e9, "unit": "bytes"}) == "55.9 GB"
    assert N.fmt_finding({"id": "a/memory_fits", "value": 0.5, "unit": "ratio"}) == "0.5"
    # a ratio judged in percent is shown in percent, beside its threshold
    assert N.fmt_finding({"id": "a/memory_fits", "value": 5.74, "unit": "ratio",
                          "threshold": "plan / GPU memory: pass <= 90%, fail > 100%"}) == "574%"


def test_tables_for_people():
    """preflight.reporting.tables: every cell through numfmt, readable names, yes/no, short paths, badges."""
    import pandas as pd

    from preflight.reporting.tables import cell, frame_html, short_paths

    html = frame_html(pd.DataFrame({
        "id": ["baseline/memory_per_gpu", "a/b"], "value": [2.4e11, float("nan")], "unit": ["bytes", "s"],
        "verdict": ["fail", "pass"], "pin_memory": [True, False],
        "source": ["/tmp/pytest-of-root/pytest-7/x0/cpu_records/scaling-n1.json", "computed from profile"],
        "samples_per_s": [308700.5, 4.571e-05]}))
    for text in ("<th>pin memory</th>", "<th>samples per s</th>", ">223.5 GiB<", ">n/a<", ">yes<", ">no<",
                 ">308,700<", ">4.6e-5<", ">scaling-n1.json<", "title='/tmp/pytest-of-root/", ">FAIL</span>",
                 'class="v v-pass"'):
        assert text in html, text
    assert "<th>unit</th>" not in html and "True" not in html and "e+05" not in html
    assert cell("6.658e+07") == "66,580,000" and cell("1.0e-4") == "1.0e-4" and cell(12345) == "12,345"
    assert short_paths("recorded (/tmp/a/b/scaling-n1.json, 2026-11-30)") == "recorded (scaling-n1.json, 2026-11-30)"
    assert short_paths("pass >= 80%, fail < 60% (1/2 of it)") == "pass >= 80%, fail < 60% (1/2 of it)"


def test_changes_are_signed():
    assert N.fmt_delta(-0.05, "fraction") == "-5.0 pp" and N.fmt_delta(2e9, "bytes") == "+2 GB"
    assert N.fmt_delta(0.0, "x") == "0" and N.fmt_delta(None, "s") == "" and N.fmt_delta(1, "bool") == ""
    assert N.fmt_delta(-120, "s") == "-120 s" and N.fmt_delta(3600, "s") == "+3,600 s (60 min)"
    assert N.fmt_rel(0.25) == "+25.0%" and N.fmt_rel(0) == "0" and N.fmt_rel(None) == ""


def test_plural_counts_and_nouns():
    from preflight.core.numfmt import plural

    assert plural(1, "node") == "1 node" and plural(2048, "GPU") == "2,048 GPUs"
    assert plural(1, "micro-batch") == "1 micro-batch" and plural(4, "micro-batch") == "4 micro-batches"


def test_factor_reads_like_the_value_column():
    # a message restating a finding's factor prints it as the value column does (921x, not 920.6x)
    assert N.factor(920.6) == N.fmt_value(920.6, "x") == "921x"
    assert N.factor(9.894) == "9.89x" and N.factor(0.375) == "0.375x" and N.factor(1843.2) == "1,843x"
    assert N.factor(float("inf")) == N.fmt_value(float("inf"), "x") == "unbounded"

