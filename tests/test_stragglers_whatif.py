"""The straggler what-if (``load_balance/straggler_cost``): the published answers of ByteDance-Seed's
StragglerAnalysis on its AR and ST traces (``../shared/stragglers``, Apache-2.0), labelled synthetic
jobs (healthy, a slow worker, a heavy last stage, long and short sequences, plain jitter) and the bad
inputs (exit 2, the file named)."""
import functools
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from preflight.diagnose.stragglers_graph import build
from preflight.diagnose.stragglers_replay import replay
from preflight.diagnose.stragglers_trace import StragglerTraceError, load, read_meta, read_trace
from preflight.diagnose.stragglers_whatif import analyze, straggler_finding

PY = sys.executable
SHARED = REPO.parent / "shared" / "stragglers"
needs_shared = pytest.mark.skipif(not (SHARED / "AR" / "trace-AR.parquet").is_file(),
                                  reason="../shared/stragglers (the published traces) is not beside the clone")


def _published(name: str) -> tuple[dict, dict, dict]:
    d = SHARED / name
    return tuple(json.loads((d / f"{k}-{name}.json").read_text()) for k in ("result", "mw", "ms"))


# --- the published answers -------------------------------------------------------------------------

@functools.cache
def _case(name: str) -> tuple:
    return (name, analyze(SHARED / name), *_published(name))


@pytest.fixture(params=["AR", "ST"])
def case(request):
    if not (SHARED / request.param / f"trace-{request.param}.parquet").is_file():
        pytest.skip("../shared/stragglers (the published traces) is not beside the clone")
    return _case(request.param)


def test_published_slowdown_within_2_percent(case):
    name, res, pub, mw, ms = case
    assert res["slowdown"] == pytest.approx(pub["blocking_slowdown"], rel=0.02)
    assert res["launch_slowdown"] == pytest.approx(pub["launch_slowdown"], rel=0.02)
    for ours, theirs in (("step_time_recorded_s", "step_t_base"), ("step_time_s", "step_t_nodelay"),
                         ("step_time_ideal_s", "step_t_noblk")):
        assert res[ours] == pytest.approx(np.mean(list(pub[theirs].values())), rel=0.02)
    per_step = {int(k): v for k, v in pub["blocking_step_slowdown"].items()}
    assert res["slowdown_per_step"].keys() == per_step.keys()
    assert all(res["slowdown_per_step"][s] == pytest.approx(v, rel=0.02) for s, v in per_step.items())
    assert res["quality"]["replay_error"] < 0.01          # the graph explains the recorded starts
    assert res["finding"]["value"] == pytest.approx(res["slowdown"]) and res["finding"]["verdict"] == "fail"


def test_published_attribution_by_stage_dp_rank_and_op_type(case):
    name, res, pub, mw, ms = case
    for ours, key, theirs in (("by_stage", "stage", "blocking_decompose_by_stage"),
                              ("by_dp_rank", "dp_rank", "blocking_decompose_by_dp_rank"),
                              ("by_optype", "optype", "blocking_decompose_by_optype")):
        got = {str(r[key]): r["slowdown_alone"] for r in res[ours]}
        assert got.keys() == pub[theirs].keys()
        assert all(got[k] == pytest.approx(v, rel=0.02) for k, v in pub[theirs].items()), ours
    assert res["causes"]["m_w"] == pytest.approx(mw["Mw"], abs=0.02)
    assert res["causes"]["m_s"] == pytest.approx(ms["Ms"], abs=0.02)


@needs_shared
def test_ar_one_slow_worker():
    name, res, *_ = _case("AR")
    named = res["causes"]["named"]
    assert [c["cause"] for c in named] == ["slow worker"]
    assert named[0]["where"][0].startswith("rank 0 = dp 0, stage 0")
    top, second = res["by_worker"][:2]
    assert (top["rank"], top["dp_rank"], top["stage"]) == (0, 0, 0) and top["recovered"] > 0.9
    assert top["slowdown_paper"] == pytest.approx(1.9730, abs=0.001)      # README: S_w of the straggler
    assert second["slowdown_paper"] <= 1.0112 + 0.001 and second["recovered"] < 0.1
    assert "rank 0" in res["finding"]["fix"]


@needs_shared
def test_st_last_stage_overloaded():
    name, res, *_ = _case("ST")
    named = res["causes"]["named"]
    assert named[0]["cause"] == "stage imbalance" and named[0]["where"][0].startswith("stage 3:")
    assert "slow worker" not in [c["cause"] for c in named]
    assert {r["rank"] for r in res["by_worker"][:2]} == {6, 7}             # the last stage's two workers
    assert res["by_stage"][0]["stage"] == 3 and res["by_stage"][0]["recovered"] > 1.0
    assert "stage 3" in res["finding"]["fix"]


# --- labelled synthetic jobs ---------------------------------------------------------------------------

COMM_WORK = {"forward-send": 5e-4, "forward-recv": 5e-4, "backward-send": 5e-4, "backward-recv": 5e-4,
             "params-all-gather": 3e-3, "grads-reduce-scatter": 6e-3, "layernorm-grads-all-reduce": 1e-4,
             "embedding-grads-all-reduce": 2e-3, "optimizer-clip-main-grad": 1e-3, "optimizer": 4e-3, "gc": 1e-4}


def _schedule(pp: int, s: int, m: int) -> list[tuple[str, int]]:
    """One worker's ops of a one-forward-one-backward step, in the order it issues them."""
    warm = min(pp - s - 1, m)
    comp = [("F", k) for k in range(warm)]
    for i in range(m - warm):
        comp += [("F", warm + i), ("B", i)]
    comp += [("B", k) for k in range(m - warm, m)]
    ops = [("params-all-gather", 0)]
    for kind, k in comp:
        if kind == "F":
            ops += [("forward-recv", k)] * (s > 0) + [("forward-compute", k)] + [("forward-send", k)] * (s < pp - 1)
        else:
            ops += [("backward-recv", k)] * (s < pp - 1) + [("backward-compute", k)] + [("backward-send", k)] * (s > 0)
    ops += [("gc", 0), ("layernorm-grads-all-reduce", 0)] + [("embedding-grads-all-reduce", 0)] * (s in (0, pp - 1))
    return ops + [("grads-reduce-scatter", 0), ("optimizer-clip-main-grad", 0), ("optimizer", 0)]


def synth(folder, compute, pp=4, dp=2, m=8, steps=6, tp=2):
    """A self-consistent per-op trace: ``compute(kind, step, dp, stage, microbatch)`` gives each forward
    ("F") or backward ("B") compute's seconds; the starts come from replaying the schedule's graph."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for step in range(steps):
        for d in range(dp):
            for s in range(pp):
                for pos, (t, k) in enumerate(_schedule(pp, s, m)):
                    w = compute(t[0].upper(), step, d, s, k) if t.endswith("-compute") else COMM_WORK[t]
                    rows.append(dict(dp_rank=d, stage=s, rank=tp * (d + dp * s), step=10 + step, optype=t,
                                     start_ts=float(pos), duration=w, seq_id=k, mc=0, mb_id=k if "compute" in t else -1,
                                     gmc=s))
    df = pd.DataFrame(rows).astype({"dp_rank": "int8", "stage": "int8", "rank": "int16", "optype": "category",
                                    "start_ts": "float32", "duration": "float32", "seq_id": "int32"})
    (folder / "meta-synth.yaml").write_text(f"trial_name: synth\nrun_id: 0\ndp_size: {dp}\ndsp_size: 1\n"
                                            f"pp_size: {pp}\ntp_size: {tp}\nvpp_size: 1\nworld_size: {dp * pp * tp}\n")
    path = folder / "trace-synth.parquet"
    df.to_parquet(path)
    tr = read_trace(path, read_meta(folder / "meta-synth.yaml"))       # placeholder starts: the order only
    start, end = replay(build(tr), tr.dur.astype(np.float64))
    ix = {op: n for n, op in enumerate(tr.ops)}
    n = np.array([ix[(s, t, q)] for s, t, q in zip(df.stage, df.optype.astype(str), df.seq_id)])
    si, d = df.step.to_numpy() - 10, df.dp_rank.to_numpy()
    df["start_ts"] = start[n, si, d].astype("float32")
    df["duration"] = (end[n, si, d] - start[n, si, d]).astype("float32")
    df.to_parquet(path)
    return folder


def test_healthy_job_costs_nothing_and_names_no_cause(tmp_path):
    rng = np.random.default_rng(0)
    folder = synth(tmp_path / "healthy", lambda k, *_: (0.010 if k == "F" else 0.020) * (1 + 0.005 * rng.standard_normal()))
    res = analyze(folder)
    assert res["slowdown"] == pytest.approx(1.0, abs=0.02)
    assert res["quality"]["replay_error"] < 1e-4                # the synthetic starts are the graph's own
    assert res["causes"]["named"] == []
    f = straggler_finding(folder)
    assert f["id"] == "load_balance/straggler_cost" and f["verdict"] == "pass" and "nothing straggles" in f["message"]


def test_slow_worker_is_named_with_its_rank(tmp_path):
    slow = lambda k, step, d, s, mb: (0.010 if k == "F" else 0.020) * (1.6 if (d, s) == (1, 2) else 1.0)
    res = analyze(synth(tmp_path / "slow", slow))
    assert res["slowdown"] > 1.2
    assert res["causes"]["named"][0]["cause"] == "slow worker"
    assert res["by_worker"][0]["rank"] == 2 * (1 + 2 * 2)           # rank = tp * (dp + dp_size * stage)
    assert res["causes"]["named"][0]["where"][0].startswith("rank 10 = dp 1, stage 2")


def test_heavy_last_stage_is_stage_imbalance(tmp_path):
    heavy = lambda k, step, d, s, mb: (0.010 if k == "F" else 0.020) * (1.5 if s == 3 else 1.0)
    res = analyze(synth(tmp_path / "stage", heavy))
    named = [c["cause"] for c in res["causes"]["named"]]
    assert named[0] == "stage imbalance" and "slow worker" not in named
    assert res["causes"]["stage_load"][3] > 1.2 and res["by_stage"][0]["stage"] == 3


def test_long_and_short_sequences_are_sequence_length_imbalance(tmp_path):
    rng = np.random.default_rng(1)
    tokens = rng.lognormal(0.0, 0.6, size=(6, 2, 8))             # per step, dp rank, microbatch: all stages see it
    seq = lambda k, step, d, s, mb: (0.010 if k == "F" else 0.020) * tokens[step, d, mb]
    res = analyze(synth(tmp_path / "seq", seq))
    assert res["slowdown"] > 1.05 and res["causes"]["fwd_bwd_correlation"] > 0.9
    named = [c["cause"] for c in res["causes"]["named"]]
    assert named[0] == "sequence-length imbalance" and "slow worker" not in named


def test_uncorrelated_jitter_is_not_called_sequence_imbalance(tmp_path):
    rng = np.random.default_rng(2)
    jitter = lambda k, *_: (0.010 if k == "F" else 0.020) * rng.lognormal(0.0, 0.5)
    res = analyze(synth(tmp_path / "jitter", jitter))
    assert res["slowdown"] > 1.05 and abs(res["causes"]["fwd_bwd_correlation"]) < 0.3
    assert "sequence-length imbalance" not in [c["cause"] for c in res["causes"]["named"]]


# --- the command and bad input -----------------------------------------------------------------------

def _cli(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(REPO / "lib")}
    return subprocess.run([PY, "-m", "preflight", "traces", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=env)


def test_cli_json_gives_the_finding(tmp_path):
    folder = synth(tmp_path / "slow", lambda k, step, d, s, mb: 0.01 * (2.0 if (d, s) == (0, 1) else 1.0))
    r = _cli(folder, "--json", "--fail-on", "fail")
    assert r.returncode == 1, r.stderr                            # S well above 1.10: fail
    out = json.loads(r.stdout)
    (f,) = out["findings"]
    assert f["id"] == "load_balance/straggler_cost" and f["chapter"] == 4 and f["value"] == pytest.approx(out["slowdown"])
    assert out["exit_code"] == 1 and out["causes"]["named"][0]["cause"] == "slow worker"


def _bad(tmp_path, edit=None, meta=None):
    folder = synth(tmp_path / "bad", lambda k, *_: 0.01, pp=2, dp=2, m=2, steps=2)
    path = folder / "trace-synth.parquet"
    if edit:
        edit(pd.read_parquet(path)).to_parquet(path)
    if meta:
        (folder / "meta-synth.yaml").write_text(meta)
    return folder


@pytest.mark.parametrize("what, edit, meta, words", [
    ("missing column", lambda df: df.drop(columns=["duration"]), None, "missing column duration"),
    ("negative duration", lambda df: df.assign(duration=df.duration.where(df.index != 3, -0.5)), None,
     "column 'duration': 1 value out of range (row 3: -0.5)"),
    ("a worker short of an op", lambda df: df.drop(index=5), None, "is missing"),
    ("unknown op type", lambda df: df.assign(optype=df.optype.astype(str).where(df.index != 0, "matmul")), None,
     "unknown operation type 'matmul'"),
    ("world disagrees", None, "trial_name: x\ndp_size: 2\npp_size: 2\ntp_size: 2\ndsp_size: 1\nworld_size: 16\n",
     "world_size = 16 but dp_size x pp_size x tp_size x dsp_size = 2 x 2 x 2 x 1 = 8"),
    ("meta disagrees with trace", None, "trial_name: x\ndp_size: 4\npp_size: 2\ntp_size: 1\ndsp_size: 1\nworld_size: 8\n",
     "dp_size = 4"),
])
def test_bad_input_is_refused_naming_the_file(tmp_path, what, edit, meta, words):
    folder = _bad(tmp_path, edit, meta)
    with pytest.raises(StragglerTraceError, match=None) as err:
        load(folder)
    assert words in str(err.value), what
    assert ("meta-synth.yaml" if meta else "trace-synth.parquet") in str(err.value)


def test_cli_exits_2_naming_the_file(tmp_path):
    folder = _bad(tmp_path, lambda df: df.drop(columns=["start_ts", "step"]))
    r = _cli(folder)
    assert r.returncode == 2 and r.stdout == ""
    assert "trace-synth.parquet: missing columns step, start_ts" in r.stderr
    (folder / "trace-synth.parquet").write_bytes(b"PAR1 not really")
    r = _cli(folder, "--json")
    assert r.returncode == 2 and "trace-synth.parquet: not a readable Parquet file" in r.stderr
    (folder / "meta-synth.yaml").unlink()
    r = _cli(folder)
    assert r.returncode == 2 and "expected one job meta file (meta*.yaml)" in r.stderr


@needs_shared
def test_readme_stragglers_block_as_written(tmp_path):
    import re
    import shlex

    text = (REPO / "README.md").read_text()
    section = text.split("### What your stragglers cost: `traces` on a per-op trace", 1)[1].split("\n## ", 1)[0]
    lines = [re.sub(r"\s+#.*$", "", ln).strip() for ln in re.findall(r"```bash\n(.*?)```", section, re.S)[0].splitlines()]
    lines = [ln for ln in lines if ln]
    assert len(lines) == 2
    (tmp_path / "shared").symlink_to(SHARED.parent)
    work = tmp_path / "clone"
    work.mkdir()
    codes = []
    for ln in lines:
        cmd, _, redirect = ln.partition(" > ")
        r = subprocess.run([PY if a == "python" else a for a in shlex.split(cmd)], capture_output=True, text=True,
                           timeout=120, cwd=work, env={**os.environ, "PYTHONPATH": str(REPO / "lib")})
        if redirect:
            (work / redirect.strip()).write_text(r.stdout)
        codes.append(r.returncode)
    assert codes == [0, 0], r.stderr
    out = json.loads((work / "stragglers.json").read_text())
    assert out["findings"][0]["value"] == pytest.approx(1.973, abs=0.001)
