"""All-reduce sweep: the alpha-beta fit on synthetic data, one real 2-process quick sweep under
torchrun (gloo on the CPU), records read back, and the command line refusing bad arguments."""
from __future__ import annotations

import math
import random
import subprocess
import sys

import pytest

from preflight.bench import allreduce
from preflight.core.records import make_record
from preflight.harness.launch import max_processes
from preflight.models.alphabeta import fit_alpha_beta, fit_error_by_size
from preflight.models.comm import busbw_factor, ring_allreduce_time

SIZES = [4096 * 4**k for k in range(9)]          # 4 KB .. 256 MB


# ---------------------------------------------------------------------------- the fit (pure)
@pytest.mark.parametrize("ranks, alpha, bw", [(2, 1.5e-4, 1.7), (8, 5e-6, 100.0), (512, 2e-5, 25.0)])
def test_fit_recovers_exact_parameters(ranks, alpha, bw):
    times = [ring_allreduce_time(s, ranks, bw, alpha) for s in SIZES]
    fit = fit_alpha_beta(SIZES, times, ranks)
    assert fit["alpha_s"] == pytest.approx(alpha, rel=1e-9)
    assert fit["bandwidth_GBps"] == pytest.approx(bw, rel=1e-9)
    assert fit["max_rel_error"] < 1e-9 and fit["constrained"] is None
    assert len(fit["rel_error"]) == len(SIZES)


def test_fit_noisy_data_within_bounds():
    rng = random.Random(7)
    for ranks, alpha, bw in [(2, 1.5e-4, 1.7), (8, 5e-6, 100.0)]:
        times = [ring_allreduce_time(s, ranks, bw, alpha) * rng.lognormvariate(0, 0.05) for s in SIZES]
        fit = fit_alpha_beta(SIZES, times, ranks)
        assert fit["alpha_s"] == pytest.approx(alpha, rel=0.2)
        assert fit["bandwidth_GBps"] == pytest.approx(bw, rel=0.2)
        assert fit["max_rel_error"] < 0.25
        assert fit["median_rel_error"] <= fit["max_rel_error"]
        assert fit["rel_error"] == pytest.approx(fit_error_by_size(SIZES, times, ranks, fit["alpha_s"],
                                                                   fit["bandwidth_GBps"]))


def test_fit_alpha_never_negative():
    # times growing faster than linearly: the unconstrained intercept is negative -> alpha = 0, refit
    times = [2 * 0.5 * s / 1e9 * (s / 4096) ** 0.15 for s in SIZES]
    fit = fit_alpha_beta(SIZES, times, 2)
    assert fit["alpha_s"] == 0.0 and fit["constrained"] == "alpha=0"
    assert fit["bandwidth_GBps"] > 0
    rng = random.Random(3)
    for _ in range(200):        # bandwidth-bound data with heavy noise: still never below zero
        times = [s / 2e9 * rng.lognormvariate(0, 0.3) for s in SIZES]
        f = fit_alpha_beta(SIZES, times, 2)
        assert f["alpha_s"] >= 0 and f["bandwidth_GBps"] > 0


@pytest.mark.parametrize("sizes, times, ranks", [
    ([4096, 4096], [1e-3, 1e-3], 2),                 # one distinct size
    (SIZES, [1e-3] * len(SIZES), 1),                 # nothing to reduce
    (SIZES, [1e-3 / (k + 1) for k in range(len(SIZES))], 2),    # time falls with size: no bandwidth
    (SIZES, [0.0] * len(SIZES), 2),
    (SIZES[:3], [1e-3, 2e-3], 2),
])
def test_fit_rejects_degenerate_input(sizes, times, ranks):
    with pytest.raises(ValueError):
        fit_alpha_beta(sizes, times, ranks)


def test_message_sizes():
    assert allreduce.message_sizes(4096, 16 * 1024**2) == [4096 * 4**k for k in range(7)]
    assert allreduce.message_sizes(4096, 65536, factor=2) == [4096, 8192, 16384, 32768, 65536]
    assert allreduce.message_sizes(1000, 5000) == [1000, 4000, 5000]


def test_sweep_frame_without_fit():
    rows = [{"bytes": 4, "time_s": 1e-4, "p10_s": 1e-4, "p90_s": 2e-4, "algbw_GBps": 4e-5, "busbw_GBps": 0.0}]
    rec = make_record("allreduce", 1, {}, {"world_size": 1, "rows": rows, "fit": None}, device={"name": "x"})
    df = allreduce.sweep_frame(rec)
    assert list(df.columns) == allreduce.COLUMNS and math.isnan(df["fit_rel_error"][0])


# ---------------------------------------------------------------------------- a real sweep
@pytest.fixture(scope="module")
def quick_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("allreduce")
    return allreduce.run_sweep(nproc=2, out=out, quick=True, timeout=120), out


def test_run_sweep_two_processes(quick_sweep):
    df, _ = quick_sweep
    assert list(df.columns) == allreduce.COLUMNS
    assert df["bytes"].tolist() == [4096 * 4**k for k in range(7)]
    assert (df["busbw_GBps"] / df["algbw_GBps"] == busbw_factor(2)).all()    # a definition: exactly 1
    assert (df["algbw_GBps"] > 0).all() and (df["time_s"] > 0).all()
    assert ((df["p10_s"] <= df["time_s"]) & (df["time_s"] <= df["p90_s"])).all()
    assert df["time_s"].iloc[-1] > df["time_s"].iloc[0]
    rec = df.attrs["record"]
    assert rec["method"] == "allreduce" and rec["method_version"] == allreduce.METHOD.version
    assert rec["device"]["name"] and rec["versions"]["torch"]
    res = rec["results"]
    assert (res["world_size"], res["nodes"], res["launcher"]) == (2, 1, "torchrun")
    assert res["backend"] in ("gloo", "nccl") and res["device"]
    assert res["fit"]["alpha_s"] >= 0 and res["fit"]["bandwidth_GBps"] > 0
    assert rec["params"]["sizes"] == df["bytes"].tolist() and rec["params"]["dtype"] == "float32"


def test_fit_holds_at_the_largest_size(quick_sweep):
    # The fit weighs every size alike (relative error), so it is off by 10-40% here and there; at the
    # largest size it must stay within 50%. A busy machine (other jobs on the 2 cores) inflates the big
    # sizes' medians by preemption and pushed it past that in ~1 sweep in 40: measure once more then.
    df, _ = quick_sweep
    err = abs(df["fit_rel_error"].iloc[-1])
    if err >= 0.5:
        df = allreduce.run_sweep(nproc=2, quick=True, timeout=120)
        err = abs(df["fit_rel_error"].iloc[-1])
    assert err < 0.5, df.to_string()


def test_load_sweeps_reads_it_back(quick_sweep):
    df, out = quick_sweep
    recs = allreduce.load_sweeps(out)
    assert len(recs) == 1 and recs[0]["_path"].endswith("allreduce-n2.json")
    again = allreduce.sweep_frame(recs[0])
    assert again.equals(df)


# ---------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("args, names", [
    (["--min-bytes", "1"], "--min-bytes"),
    (["--out", "x", "--max-bytes", "8G"], "--max-bytes"),
    (["--out", "x", "--min-bytes", "1M", "--max-bytes", "64K"], "--max-bytes"),
    (["--out", "x", "--iters", "0"], "--iters"),
    (["--out", "x", "--iters", "20000"], "--iters"),
    (["--out", "x", "--dtype", "int8"], "--dtype"),
])
def test_cli_rejects_bad_arguments(args, names, tmp_path):
    r = subprocess.run([sys.executable, "-m", "preflight.bench.allreduce", *args], check=False,
                       capture_output=True, text=True, timeout=30, cwd=tmp_path)     # no torchrun: validation comes first
    assert r.returncode == 2, r.stderr
    assert f"argument {names}" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "x").exists()


def test_run_sweep_refuses_more_processes_than_cores():
    limit, _ = max_processes()
    with pytest.raises(ValueError, match=f"at most|1 to {limit}"):
        allreduce.run_sweep(nproc=limit + 1)
    with pytest.raises(ValueError):
        allreduce.run_sweep(nproc=0)
