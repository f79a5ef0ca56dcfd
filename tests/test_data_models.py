"""The data-pipeline formulas (preflight.models.data) and the chapter's profile findings."""
import math

import pytest

from conftest import EXAMPLE
from preflight.chapters import data_pipeline as C
from preflight.core.findings import FindingSink
from preflight.core.profile import load_profile
from preflight.models import data as M


def test_field_case_listing_is_over_an_hour_on_lustre_and_seconds_as_shards():
    # 10 million files, ~0.5 ms per stat from one client: the field report's "20+ minutes" is the
    # optimistic side (many clients, cached directories); serially it is well over an hour.
    s = M.listing_time_s(10_000_000, "lustre")
    assert s == pytest.approx(5000.0)
    shards = M.shard_count(10_000_000, 8, 256)
    assert shards == 313                         # 80 GB / 256 MB, rounded up
    assert M.listing_time_s(shards, "lustre") < 1.0


def test_object_store_lists_in_pages():
    assert M.listing_time_s(1000, "object") == pytest.approx(0.03)
    assert M.listing_time_s(1001, "object") == pytest.approx(0.06)
    assert M.listing_time_s(1001, "object", per_file_s=1e-3) == pytest.approx(1.001)


def test_every_storage_has_a_source_and_sane_order():
    lat = M.METADATA_LATENCY
    assert set(lat) == {"local_nvme", "lustre", "gpfs", "nfs", "object"}
    assert all(v.source for v in lat.values())
    assert lat["local_nvme"].stat_s < lat["nfs"].stat_s < lat["object"].stat_s
    with pytest.raises(ValueError, match="accepted"):
        M.latency("tape")


def test_headroom_idle_and_workers():
    assert M.headroom(1200, 1000) == pytest.approx(1.2)
    assert M.idle_share(500, 1000) == pytest.approx(0.5)
    assert M.idle_share(2000, 1000) == 0.0
    # 1.2 x 10,000 samples/s at 3,000 per worker -> 4 workers
    assert M.workers_needed(10_000, 3_000) == 4
    assert M.workers_needed(10, 3_000) == 1
    with pytest.raises(ValueError):
        M.headroom(1, 0)


@pytest.mark.parametrize("cores,expected", [(1, (1, 1)), (2, (1, 1)), (16, (11, 12)), (64, (44, 51))])
def test_recommended_workers(cores, expected):
    assert M.recommended_workers(cores) == expected


def test_recommended_workers_are_per_rank():
    """70-80 % of a 64-core node shared by 8 training processes: 5-6 workers each, not 44-51."""
    assert M.recommended_workers(64, local_ranks=8) == (5, 6)
    assert M.recommended_workers(64) == (44, 51)
    with pytest.raises(ValueError, match="local_ranks"):
        M.recommended_workers(64, local_ranks=0)


def test_open_time_spreads_over_readers():
    assert M.open_time_s(1000, "lustre", readers=10) == pytest.approx(1000 * 2.3e-3 / 10)
    with pytest.raises(ValueError):
        M.open_time_s(10, "lustre", readers=0)


def test_listing_finding_fails_the_example_and_passes_sharded_data(tmp_path):
    prof = load_profile(EXAMPLE)
    sink = FindingSink(tmp_path / "f.json", "data_pipeline")
    C.add_listing_finding(sink, prof)
    f = sink.findings[-1]
    assert f.id == "data_pipeline/listing_s_at_profile" and f.verdict == "fail"
    assert f.value == pytest.approx(5000.0)
    assert "313 shards" in f.message and "64 MB" in f.message

    sharded = prof.model_copy(update={"data": prof.data.model_copy(update={"files": 400, "mean_file_kB": 256_000})})
    C.add_listing_finding(sink, sharded)
    assert sink.findings[-1].verdict == "pass"


def test_listing_table_marks_the_profile_storage_and_measured_row():
    prof = load_profile(EXAMPLE)
    df = C.listing_table(prof, measured_stat_s=2e-6)
    assert "Lustre (profile)" in set(df["storage"]) and "local NVMe" in set(df["storage"])
    last = df.iloc[-1]
    assert last["storage"].startswith("this machine")
    assert math.isclose(last["small files: listing (s)"], 10_000_000 * 2e-6)


def test_plan_only_measured_findings_are_info(tmp_path):
    prof = load_profile(EXAMPLE)
    sink = FindingSink(None, "data_pipeline")
    C.add_measured_findings(sink, prof, None, None, None)
    ids = {f.id for f in sink.findings}
    assert ids == {"data_pipeline/small_file_slowdown", "data_pipeline/h2d_pinned_speedup", "data_pipeline/headroom",
                   "data_pipeline/headroom_default", "data_pipeline/best_loader_setting",
                   "data_pipeline/instrumentation_overhead"}
    assert all(f.verdict == "info" and f.value is None for f in sink.findings)


def test_setting_label():
    assert M.setting_label({"num_workers": 0, "prefetch_factor": None, "pin_memory": False}) == \
        "num_workers=0, pin_memory=False"
    assert M.setting_label({"num_workers": 2, "prefetch_factor": 4, "pin_memory": True}) == \
        "num_workers=2, prefetch_factor=4, pin_memory=True"
