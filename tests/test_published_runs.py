"""The published-run sets (data/profiles/{published,bridge,heldout}) and their loader, tools/published_runs.py:
every profile validates, every row has a family and a positive figure, the calibration and held-out sets
share no run, and the loader refuses an index that does not match its profiles."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

from preflight.core.profile import load_profile

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

from published_runs import FOLDERS, all_runs, runs  # noqa: E402


@pytest.mark.parametrize("folder", list(FOLDERS))
def test_every_profile_validates_and_every_row_has_a_family_and_a_figure(folder):
    rows = runs(folder)
    assert rows, f"{folder}: no rows"
    for row in rows:
        profile = load_profile(row["profile"])
        assert profile.project == row["name"]
        assert row["pub_tok_s_gpu"] > 0
        source, chip, precision = row["family"].split("/")
        assert source and chip and precision
        if folder == "published":
            continue  # older sets: the step comes from the source's MFU figure, rounded
        # the stated step is the published figure's step: global batch x sequence / GPUs / tokens/s per GPU
        t = profile.training
        gbs = t.micro_batch_size * t.microbatches * profile.dp
        step = gbs * profile.model.seq_len / (profile.gpus * row["pub_tok_s_gpu"])
        assert t.step_compute_s == pytest.approx(step, rel=2e-3), row["name"]


def test_the_families_name_the_profiles_chip_and_precision():
    chips = {"H800": "H100-SXM", "H100": "H100-SXM", "H200": "H200-SXM", "B200": "B200", "GB200": "GB200",
             "B300": "B300", "GB300": "GB300"}
    for row in runs("bridge") + runs("heldout"):
        profile = load_profile(row["profile"])
        _, chip, precision = row["family"].split("/")
        assert profile.cluster.gpu == chips[chip], row["name"]
        assert profile.training.fp8 == (precision != "bf16"), row["name"]
        if profile.training.fp8:
            assert precision.startswith("mxfp8") == (profile.training.fp8_recipe == "mxfp8"), row["name"]


def test_no_run_is_both_calibration_and_held_out():
    fit, held = runs("bridge"), runs("heldout")
    assert not {r["name"] for r in fit} & {r["name"] for r in held}
    assert not {r["family"] for r in fit} & {r["family"] for r in held}

    # the same published table row under another name would still be a leak: compare what the source printed
    def printed(folder, index):
        entries = yaml.safe_load((REPO / "data/profiles" / folder / index).read_text())
        return {(v["source"], v["figures"]) for v in entries.values()}

    assert not printed("bridge", "bridge.yaml") & printed("heldout", "heldout.yaml")
    # the calibration set holds Megatron-Bridge's 26.08 / 26.06.01 / 26.06 releases only
    assert {r["family"].split("/")[0] for r in fit} <= {"bridge-26.08", "bridge-26.06.01", "bridge-26.06", "bridge-26.06-sft"}
    assert not any(r["family"].startswith(("bridge-26.08", "bridge-26.06")) for r in held)


def test_published_runs_get_a_family_from_their_source():
    families = {r["name"]: r["family"] for r in runs("published")}
    assert len(families) == 34
    assert families["mcore-70b"] == "mcore/H100-SXM/16bit"
    assert families["tt-llama31-8b-h100-8"] == "tt-202412/H100-SXM/16bit"
    assert len(all_runs()) == 34 + len(runs("bridge")) + len(runs("heldout"))


def test_deepseek_v3_report_row_is_its_published_layout():
    (row,) = [r for r in runs("heldout") if r["family"] == "deepseek-v3-report/H800/fp8"]
    assert row["pub_tok_s_gpu"] == pytest.approx(14.8e12 / (2.664e6 * 3600))  # 1,543 tokens/s per GPU
    p = load_profile(row["profile"])
    assert (p.gpus, p.training.pp, p.training.ep, p.training.tp, p.dp) == (2048, 16, 64, 1, 128)
    assert (p.model.qk_head_dim, p.model.v_head_dim, p.model.moe_layers) == (192, 128, 58)
    assert p.training.moe_dispatch_fp8 and p.training.moe_node_limit == 4 and p.training.fp8_recipe == "blockwise"
    assert p.cluster.intra_node_GBps == 160  # H800's NVLink, planned on an H100-SXM


@pytest.fixture
def bridge_copy(tmp_path):
    dest = tmp_path / "bridge"
    shutil.copytree(REPO / "data/profiles/bridge", dest)
    return dest


def _edit_index(folder: Path, edit):
    index = folder / "bridge.yaml"
    entries = yaml.safe_load(index.read_text())
    edit(entries)
    index.write_text(yaml.safe_dump(entries))


def test_loader_reads_a_copied_folder(bridge_copy):
    assert [r["name"] for r in runs(bridge_copy)] == [r["name"] for r in runs("bridge")]


@pytest.mark.parametrize("field,value,message", [("family", None, "family"), ("family", "bridge-26.08", "family"),
                                                 ("pub_tok_s_gpu", 0, "pub_tok_s_gpu"),
                                                 ("pub_tok_s_gpu", "fast", "pub_tok_s_gpu")])
def test_loader_refuses_a_row_without_family_or_figure(bridge_copy, field, value, message):
    def edit(entries):
        entries[sorted(entries)[0]][field] = value
    _edit_index(bridge_copy, edit)
    with pytest.raises(ValueError, match=message):
        runs(bridge_copy)


def test_loader_refuses_an_index_that_does_not_match_its_profiles(bridge_copy):
    victim = sorted(bridge_copy.glob("bridge-*.yaml"))[0]
    victim.unlink()
    with pytest.raises(ValueError, match=f"entries without a profile.*{victim.stem}"):
        runs(bridge_copy)


def test_loader_refuses_a_folder_without_an_index(tmp_path):
    with pytest.raises(ValueError, match="no index file"):
        runs(tmp_path)
