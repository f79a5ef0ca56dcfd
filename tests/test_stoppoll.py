"""The stop-file poll at scale (preflight.toolkit.stoppoll): the interval formula, one rank, and two
ranks under torchrun (gloo) stopping after the same step; the shrink's log analysis
(preflight.bench.elastic.shrink_results) on hand-made logs, where a lost or repeated sample and a
differing loss must show."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from preflight.bench import elastic
from preflight.bench.resume import LogTail
from preflight.harness.trainloop import read_log
from preflight.toolkit.stoppoll import BUDGET, MAX_DELAY_S, StopPoller, poll_interval


@pytest.mark.parametrize("check_s, step_s, k", [
    (0.2e-3, 1.0, 1),          # a slow step: every step
    (0.5e-3, 0.020, 25),       # 0.5 ms / (0.1 % of 20 ms)
    (1e-3, 0.010, 100),
    (10e-3, 0.001, 5000),      # capped: at most MAX_DELAY_S (5 s) of steps between two checks
    (1e-3, 10.0, 1),           # steps longer than the delay cap: still every step
    (1e-3, 0.0, 1),            # nothing measured yet
])
def test_poll_interval(check_s, step_s, k):
    assert poll_interval(check_s, step_s) == k


def test_poll_interval_keeps_the_check_under_the_budget():
    for check_s in (1e-5, 1e-4, 1e-3, 3e-3):
        for step_s in (0.005, 0.05, 0.5, 2.0):
            k = poll_interval(check_s, step_s)
            assert check_s / (k * step_s) <= BUDGET + 1e-12 or k * step_s > MAX_DELAY_S - step_s
            assert k * step_s <= max(step_s, MAX_DELAY_S)


def test_one_rank_sees_the_file_at_a_check_and_only_then(tmp_path):
    stop = tmp_path / "STOP"
    p = StopPoller(stop, rank=0, world=1, max_delay_s=1.0)
    assert p.should_stop(1) is False and p.checks == 1          # the first check, after step 1
    step, seen, scheduled = 1, None, None
    for step in range(2, 400):
        time.sleep(0.002)
        if step == 50:
            stop.touch()
        scheduled = p.next_check                 # the check every rank knows in advance
        if p.should_stop(step):
            seen = step
            break
        assert step < 50 or p.next_check > step, "a check would have seen the file"
    # the mechanism, not the timing (k adapts to the measured step time, which load changes):
    # the file is seen at the first scheduled check at or after step 50, and at no other step
    assert seen is not None and 50 <= seen == scheduled
    assert p.checks < seen                                       # not every step
    assert StopPoller(stop, 0, 1).should_stop(1, requested=True)
    assert not StopPoller(tmp_path / "none", 0, 1).should_stop(1)


@pytest.mark.slow
def test_two_ranks_stop_after_the_same_step(tmp_path):
    """torchrun, 2 ranks (gloo): STOP appears mid-run; both ranks say they stopped, at one step, and
    the one checkpoint is at that step."""
    ck, log = tmp_path / "ck", tmp_path / "log.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
           "preflight.harness.trainloop", "--ckpt-dir", str(ck), "--losses", str(log), "--steps", "2000",
           "--ckpt-every", "1000", "--step-sleep", "0.01"]
    proc = subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        tail, deadline = LogTail(log), time.monotonic() + 120
        while tail.step() < 20:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        (ck / "STOP").touch()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    steps, events = read_log(log)
    stopped = events[events["event"] == "stopped"]
    assert sorted(stopped["rank"]) == [0, 1] and stopped["step"].nunique() == 1, stopped
    step = int(stopped["step"].iloc[0])
    assert list(events[events["event"] == "checkpoint"]["step"]) == [step]
    assert int(steps["step"].max()) == step < 2000
    assert (ck / "latest").read_text().strip() == f"step-{step:08d}"
    assert int(stopped["stop_checks"].iloc[0]) < step          # rank 0 did not look after every step


# --- the shrink's analysis on hand-made logs --------------------------------------------------------------

def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _step(step, loss, samples, world, restart=0, resumed_from=0, t=0.0):
    return {"step": step, "loss": loss, "loss_hex": float(loss).hex(), "samples": samples, "world": world,
            "restart": restart, "resumed_from": resumed_from, "epoch": 0, "t": t}


def _logs(tmp_path, after_samples=([4], [5], [6], [7]), after_losses=(0.5, 0.4, 0.3, 0.2)):
    """Uninterrupted 2 ranks: 4 steps of 2 samples; the run: 3 steps at world 2, node lost after step 3,
    resumed from step 2 at world 1 (1 sample per step); the 1-rank run from the step-2 checkpoint."""
    ref = [_step(i + 1, 1.0 - 0.1 * i, [2 * i, 2 * i + 1], 2) for i in range(4)]
    run = [{"event": "start", "t": 0.0, "restart": 0, "world": 2, "node": "n1", "resumed_from": 0},
           *ref[:3], {"event": "kill", "step": 3, "t": 10.0, "rank": 1, "node": "n2"},
           {"event": "start", "t": 20.0, "restart": 1, "world": 1, "node": "n1", "resumed_from": 2}]
    run += [_step(3 + i, loss, s, 1, restart=1, resumed_from=2, t=21.0 + i)
            for i, (loss, s) in enumerate(zip(after_losses, after_samples))]
    after = [_step(3 + i, loss, [4 + i], 1, resumed_from=2) for i, loss in enumerate((0.5, 0.4, 0.3, 0.2))]
    for name, rows in (("ref", ref), ("run", run), ("after", after)):
        _write(tmp_path / f"{name}.jsonl", rows)
    return [tmp_path / f"{n}.jsonl" for n in ("ref", "run", "after")]


def test_shrink_results_on_a_clean_change(tmp_path):
    r = elastic.shrink_results(*_logs(tmp_path))
    assert (r["world_before"], r["world_after"], r["killed_node"], r["survivor_node"]) == (2, 1, "n2", "n1")
    assert (r["killed_after_step"], r["resumed_from"], r["steps_lost"]) == (3, 2, 1)
    assert (r["recovery_s"], r["restart_s"], r["time_to_regain_s"]) == (11.0, 10.0, 11.0)
    assert (r["samples_lost"], r["samples_repeated"], r["same_order_as_uninterrupted"]) == (0, 0, True)
    assert r["before_change_equal"] and r["after_change_equal"] and r["samples_trained"] == 8
    assert r["final_loss_equal_to_uninterrupted"] is False


def test_shrink_results_see_a_lost_a_repeated_sample_and_a_changed_loss(tmp_path):
    r = elastic.shrink_results(*_logs(tmp_path, after_samples=([4], [4], [6], [7])))      # 5 lost, 4 twice
    assert (r["samples_lost"], r["samples_repeated"], r["same_order_as_uninterrupted"]) == (1, 1, False)
    r = elastic.shrink_results(*_logs(tmp_path, after_losses=(0.5, 0.4, 0.3, 0.2000001)))
    assert r["after_change_equal"] is False and r["samples_lost"] == 0
