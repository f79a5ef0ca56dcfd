"""The shared number formatting (``preflight.numfmt``): what the report, the comparison, the charts
and the sliders print for a number."""
from __future__ import annotations

import pytest

from preflight import numfmt as N


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
    assert N.fmt_value(5000, "s") == "5,000 s" and N.fmt_value(0.5, "s") == "0.5 s"
    assert N.fmt_value(7, "") == "7"


def test_changes_are_signed():
    assert N.fmt_delta(-0.05, "fraction") == "-5.0 pp" and N.fmt_delta(2e9, "bytes") == "+2 GB"
    assert N.fmt_delta(0.0, "x") == "0" and N.fmt_delta(None, "s") == "" and N.fmt_delta(1, "bool") == ""
    assert N.fmt_delta(-120, "s") == "-120 s"
    assert N.fmt_rel(0.25) == "+25.0%" and N.fmt_rel(0) == "0" and N.fmt_rel(None) == ""
