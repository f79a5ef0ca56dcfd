"""Chapter 4 findings: the plan's padding and bubble from the profile, measured ones replayed from a
quick CPU run (tests/data/cpu_records)."""
import pytest

from conftest import EXAMPLE, REPO
from preflight.chapters import load_balance as C
from preflight.core.findings import FindingSink
from preflight.core.numfmt import fmt_value, percent
from preflight.core.profile import load_profile
from preflight.core.records import load_records
from preflight.models import pipeline as P
from preflight.runner.chapter import Measured


def _measured(method):
    rec = load_records(REPO / "tests" / "data" / "cpu_records", method)[-1]
    return Measured(rec["results"], "recorded on test CPU", rec)


def _with_training(**kw):
    prof = load_profile(EXAMPLE)
    return prof.model_copy(update={"training": prof.training.model_copy(update=kw)})


def test_bubble_of_a_pipelined_plan_and_the_wrong_formula_beside_it():
    prof = _with_training(pp=4, microbatches=8)
    sink = FindingSink(None, "load_balance")
    C.add_plan_findings(sink, prof)
    f = {x.id: x for x in sink.findings}
    assert f["load_balance/bubble_fraction"].value == pytest.approx(3 / 11)
    assert f["load_balance/bubble_fraction"].verdict == "fail"
    assert f["load_balance/bubble_over_ideal"].value == pytest.approx(3 / 8)
    assert "9.4%" in f["load_balance/bubble_fraction"].message and "wrong" in f["load_balance/bubble_fraction"].message
    assert "ZB-H1" in f["load_balance/bubble_fraction"].message and "11.1%" in f["load_balance/bubble_fraction"].message


def test_interleaving_shrinks_the_bubble():
    prof = _with_training(pp=4, microbatches=32, pipeline_schedule="interleaved", interleave=2)
    sink = FindingSink(None, "load_balance")
    C.add_plan_findings(sink, prof)
    f = {x.id: x for x in sink.findings}
    assert f["load_balance/bubble_fraction"].value == pytest.approx(P.bubble_fraction(4, 32, 2)) == pytest.approx(3 / 67)
    assert f["load_balance/bubble_fraction"].verdict == "pass"


def test_lengths_file_relative_to_the_profile(tmp_path):
    import yaml

    (tmp_path / "lens.txt").write_text("\n".join(["100"] * 15 + ["1600"]) + "\n")
    d = yaml.safe_load(EXAMPLE.read_text())
    d["data"]["lengths_file"] = "lens.txt"
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(d))
    prof = load_profile(tmp_path / "p.yaml")
    sink = FindingSink(None, "load_balance")
    C.add_plan_findings(sink, prof, tmp_path / "p.yaml")
    f = {x.id: x for x in sink.findings}["load_balance/padding_waste"]
    # one batch of 16: 15 x 100 + 1600 real tokens padded to 16 x 1600
    assert f.value == pytest.approx(1 - (15 * 100 + 1600) / (16 * 1600))
    assert "lengths_file" in f.message
    # packed: all 3,100 tokens in one row of 4,096, whatever the policy; 16 samples in that one batch
    assert f"{1 - 3100 / 4096:.1%} (samples cut at row ends)" in f.message and "16-16 samples" in f.message


def test_packing_in_the_padding_finding_with_its_caveat():
    sink = FindingSink(None, "load_balance")
    table = C.add_plan_findings(sink, load_profile(EXAMPLE))
    f = {x.id: x for x in sink.findings}["load_balance/padding_waste"]
    assert len(table) == 6 and table.attrs["packing"]["samples_per_batch_min"] < table.attrs["packing"]["samples_per_batch_max"]
    packed = table.set_index("strategy")["waste"]
    assert packed.filter(like="packing").min() < 0.01 < packed["length bucketing"]
    assert "Packing into rows of 4096" in f.message and "document" in f.message and "document masks" in f.fix
    # every share in the message as the table and the value column print it (68.4%, not 68%; 0.0180%, not 0.0%)
    assert fmt_value(f.value, f.unit) in f.message
    assert all(percent(w) in f.message for w in packed.drop("pad to longest in batch"))


def test_recorded_measurements_give_every_finding():
    sink = FindingSink(None, "load_balance")
    C.add_measured_findings(sink, _measured("padding"), _measured("pipeline_bubble"), _measured("partition"))
    f = {x.id: x for x in sink.findings}
    assert f["load_balance/bucketing_speedup"].value == _measured("padding").results["bucketing_speedup"]
    rows = _measured("pipeline_bubble").results["rows"]
    assert f["load_balance/measured_bubble"].value in [r["measured_bubble"] for r in rows]
    part = _measured("partition").results
    assert f["load_balance/partition_gain"].value == pytest.approx(part["throughput_time"] / part["throughput_count"])
    # the partition placed every layer exactly once
    for key in ("by_count", "by_time"):
        assert sorted(i for stage in part[key] for i in stage) == list(range(len(part["layers"])))
