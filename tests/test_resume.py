"""Full-state checkpoints of the real training loop: bitwise resume after SIGKILL, what breaks when a
part is left out, a clean stop on request, DDP under torchrun with an elastic restart."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from preflight.bench import elastic, resume
from preflight.harness.trainloop import PARTS, Trainer, parse_args, read_log


def _cmd(tmp_path, name, steps=60, every=10, *extra):
    return resume.trainloop_cmd(tmp_path / name, tmp_path / f"{name}.jsonl", steps, every, *extra)


def test_log_tail_reads_only_appended_bytes_and_waits_for_whole_lines(tmp_path):
    """The kill watcher's tail: steps as lines arrive, a half-written line ignored until its newline,
    torn garbage skipped, a replaced (shorter) log read again from the start."""
    log = tmp_path / "l.jsonl"
    tail = resume.LogTail(log)
    assert tail.step() == 0                                   # no log yet
    with open(log, "ab") as f:
        f.write(b'{"step": 1, "loss": 2.5}\n{"step": 2, "lo')
    assert tail.step() == 1                                   # step 2 is not whole yet
    assert tail.offset == log.stat().st_size
    with open(log, "ab") as f:
        f.write(b'ss": 2.4}\n\x00\x00torn\n{"event": "save"}\n{"step": 7, "loss": 2.0}\n')
    assert tail.step() == 7
    assert tail.step() == 7                                   # nothing new: nothing re-read
    log.write_bytes(b'{"step": 3, "loss": 1.0}\n')
    assert tail.step() == 3                                   # shorter file: a new log
    assert resume.LogTail(log).step() == 3                     # a fresh tail reads it whole


def test_in_process_resume_is_bitwise_and_each_part_matters():
    """Train 30 steps, snapshot at 17 (mid-epoch: 32 batches per epoch), continue; a fresh trainer
    loaded from the snapshot reproduces steps 18..30 exactly; leaving any part out does not."""
    import torch

    from preflight.toolkit.ckpt import snapshot

    torch.set_num_threads(1)
    ref = Trainer(steps=60, seed=3)
    losses = [ref.train_step() for _ in range(17)]
    state = snapshot(ref.state())
    state["rng"] = [state["rng"]]
    tail = [ref.train_step() for _ in range(13)]
    again = Trainer(steps=60, seed=3)
    again.load(state)
    assert [again.train_step() for _ in range(13)] == tail
    for part in PARTS:
        broken = Trainer(steps=60, seed=3)
        broken.load(state, omit=frozenset({part}))
        assert [broken.train_step() for _ in range(13)] != tail, part
    assert len(losses) == 17


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise(tmp_path):
    res = resume.measure_resume(tmp_path / "work", quick=True, seed=1)
    rows = {r["variant"]: r for r in res["rows"]}
    assert res["resume_bitwise"] is True
    assert rows["full state"]["steps_compared"] == res["config"]["steps"]
    assert rows["full state"]["max_abs_diff"] == 0.0
    assert res["checkpoint_step"] < res["killed_after_step"] < res["checkpoint_step"] + res["config"]["ckpt_every"]
    assert res["steps_lost"] == res["killed_after_step"] - res["checkpoint_step"] > 0
    for part in PARTS:
        r = rows[f"without {part}"]
        assert not r["bitwise_equal"] and r["max_abs_diff"] > 1e-4, part
        assert res["checkpoint_step"] < r["first_divergent_step"] <= res["checkpoint_step"] + 2, part
    assert {c["variant"] for c in res["curves"]} == {f"without {p}" for p in PARTS}


def test_stop_file_and_sigusr1_checkpoint_and_exit_cleanly(tmp_path):
    ck = tmp_path / "ck"
    proc = subprocess.Popen(_cmd(tmp_path, "ck", 400, 50, "--step-sleep", "0.02"), env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.monotonic() + 60
    tail = resume.LogTail(tmp_path / "ck.jsonl")
    while tail.step() < 15:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    (ck / "STOP").touch()
    assert proc.wait(timeout=30) == 0
    steps, events = read_log(tmp_path / "ck.jsonl")
    stopped = events[events["event"] == "stopped"].iloc[0]
    assert not (ck / "DONE").exists()
    assert (ck / "latest").read_text().strip() == f"step-{int(stopped['step']):08d}"     # saved at the stop, not at 50
    (ck / "STOP").unlink()
    # SIGUSR1, as Slurm's --signal=USR1@<s> sends to job steps
    proc = subprocess.Popen(_cmd(tmp_path, "ck", 400, 50, "--step-sleep", "0.02"), env=dict(os.environ, OMP_NUM_THREADS="1"))
    tail = resume.LogTail(tmp_path / "ck.jsonl")              # the resumed run's log, from the start
    while tail.step() < int(stopped["step"]) + 10:
        assert time.monotonic() < deadline + 60 and proc.poll() is None
        time.sleep(0.01)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=30) == 0
    _, events = read_log(tmp_path / "ck.jsonl")
    assert (events["event"] == "stopped").sum() == 2
    starts = events[events["event"] == "start"]
    assert int(starts["resumed_from"].iloc[1]) == int(stopped["step"])


@pytest.mark.parametrize("argv, words", [
    (["--ckpt-dir", "x", "--steps", "0"], "--steps = 0: accepted 1 .. 10000000"),
    (["--ckpt-dir", "x", "--steps", "5", "--omit", "rng,weights"], "unknown part(s) ['weights']"),
    (["--ckpt-dir", "x", "--steps", "5", "--step-sleep", "-1"], "--step-sleep = -1.0: accepted 0 .. 60"),
])
def test_trainloop_rejects_bad_arguments(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2
    assert words in capsys.readouterr().err


def test_trainloop_cli_bad_argument_exit_2(tmp_path):
    p = subprocess.run([sys.executable, "-m", "preflight.harness.trainloop", "--ckpt-dir", str(tmp_path / "c"),
                        "--steps", "10", "--ckpt-every", "0"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--ckpt-every = 0" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_elastic_restart_resumes_and_matches(tmp_path):
    res = elastic.measure_elastic(tmp_path / "work", quick=True)
    assert res["restarts"] == 1
    assert res["resumed_from"] == (res["killed_after_step"] // res["config"]["ckpt_every"]) * res["config"]["ckpt_every"]
    assert res["steps_lost"] == res["killed_after_step"] - res["resumed_from"]
    assert 0 < res["recovery_s"] < 60
    assert res["time_to_regain_s"] >= res["recovery_s"]
    assert res["final_loss_equal"] is True          # DDP, 2 ranks, through a restart: bit for bit
    print(f"elastic recovery {res['recovery_s']:.2f} s, {res['steps_lost']} steps lost")
    json.dumps(res)
