"""Elastic training under torchrun: a worker dies and the job comes back; a node dies and the job
goes on with fewer.

``torchrun --max-restarts=K --rdzv-backend=c10d`` (torch.distributed.elastic) watches its workers;
when one exits abnormally (here: SIGKILL, as when the kernel's OOM killer or a hardware fault takes
a process) the agent stops the surviving workers, runs a new rendezvous, and starts them all again
with ``TORCHELASTIC_RESTART_COUNT`` one higher. The training script does the rest: it loads the
newest valid checkpoint and goes on. Measured here, with two DDP processes on gloo:

- **recovery time**: from the kill to the first training step completed after the restart
  (failure detection, teardown, rendezvous, process start with ``import torch``, checkpoint load);
- **steps lost**: the steps done since the last checkpoint, computed again;
- the final loss against an uninterrupted run of the same command (bitwise).

Known trap (field notes, a PyTorch issue): by default the restarted workers reuse the rendezvous
store's TCP server and gloo may try the dead worker's old port; ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
makes every restart clean. On a cluster the same command runs under ``srun`` on every node with the
rendezvous endpoint on the first node (see ``preflight/slurm/walltime_requeue.sbatch``).

**The shrink** (``--shrink``, method ``elastic_shrink``; the field report's 128 -> 120 nodes): two
torchrun agents, one per node, ``--nnodes=1:2`` (at least 1 node, at most 2), one worker each. After
step K the workers of node 1 SIGKILL their agent and themselves: the node is gone, no agent is left
there to restart anything. The survivor's collective fails, its agent runs a new rendezvous that
closes with the one node left (``last_call_timeout=2``: it waits 2 s for latecomers), and the worker
starts again at world size 1 from the newest checkpoint. Measured: recovery time, steps lost, world
size before / after, and the data: the checkpoint keeps the position in the epoch's permutation in
samples, so the run after the change goes on with the very next sample; the record compares the
sequence of samples trained on with the uninterrupted run's (none lost, none twice). Bitwise: every
step before the change equals the uninterrupted 2-rank run, every step after it equals a 1-rank run
started from the same checkpoint; the losses after the change do *not* equal the uninterrupted run's
(the global batch halves, 2 x 32 -> 32 samples per step: another trajectory, by design).

The rendezvous store lives in the agent of node 0 (``is_host=true``; the others ``is_host=false``):
if that node dies, the job dies with it (torchrun's single point of failure; a real cluster runs the
endpoint on a node that stays). Inside a Slurm allocation of 2+ nodes the two agents are started by
``srun``, one per node, the endpoint being the first node's address (``scontrol show node``: its
``NodeAddr``); elsewhere both run on this machine (labelled "local agents").

Runnable alone: ``python -m preflight.bench.elastic --json`` (restart), ``--shrink`` (node lost);
in a two-node allocation: ``sbatch --nodes=2 --wrap "python -m preflight.bench.elastic --shrink --out
results/"``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from preflight.core.records import Method
from preflight.harness.launch import first_slurm_host, free_port, run_torchrun

METHOD = Method("elastic", 1, required=("restarts", "killed_after_step", "resumed_from", "steps_lost", "recovery_s",
                                        "time_to_regain_s", "final_loss_equal", "wall_s"), runs_on="cpu")
SHRINK = Method("elastic_shrink", 1, required=(
    "launcher", "world_before", "world_after", "killed_after_step", "resumed_from", "steps_lost", "recovery_s",
    "samples_lost", "samples_repeated", "same_order_as_uninterrupted", "before_change_equal",
    "after_change_equal", "wall_s"), runs_on="cpu")
TIMEOUT_S = 300
# The shrink's rendezvous settings: 2 s for latecomers once the minimum (1 node) is there; a node is
# declared dead after keep_alive_max_attempt missed heartbeats, keep_alive_interval s apart (torch's
# defaults 5 s x 3 = 15 s, which made the recovery ~30 s on the 2-core test machine; 2 s x 3 here).
SHRINK_RDZV_CONF = "last_call_timeout=2,keep_alive_interval=2,keep_alive_max_attempt=3"


def torchrun_cmd(ckpt_dir: Path, log: Path, steps: int, every: int, nproc: int, max_restarts: int,
                 *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            "--rdzv-id=preflight-elastic", "--monitor-interval=0.5",
            "-m", "preflight.harness.trainloop", "--ckpt-dir", str(ckpt_dir), "--losses", str(log),
            "--steps", str(steps), "--ckpt-every", str(every), *extra]


def _run(cmd: list[str], timeout: float = TIMEOUT_S) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", PYTHONUNBUFFERED="1",
               CUDA_VISIBLE_DEVICES="")      # CPU ranks (gloo): no CUDA start-up inside the recovery time
    return run_torchrun(cmd, env, timeout)


def measure_elastic(workdir: str | os.PathLike | None = None, steps: int = 120, every: int = 20,
                    kill_step: int = 55, step_sleep: float = 0.05, nproc: int = 2, quick: bool = False) -> dict:
    """An uninterrupted torchrun run and one whose rank 1 is SIGKILLed after ``kill_step``."""
    from preflight.harness.trainloop import read_log

    if quick:
        steps, every, kill_step = 60, 10, 25
    own = workdir is None
    work = Path(workdir or tempfile.mkdtemp(prefix="preflight-elastic-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        _run(torchrun_cmd(work / "ref", work / "ref.jsonl", steps, every, nproc, 0))
        ref, _ = read_log(work / "ref.jsonl")
        t0 = time.perf_counter()
        out = _run(torchrun_cmd(work / "run", work / "run.jsonl", steps, every, nproc, 2,
                                "--kill-at-step", str(kill_step), "--kill-rank", "1", "--step-sleep", str(step_sleep)))
        wall = time.perf_counter() - t0
        steps_df, events = read_log(work / "run.jsonl")
        kill = events[events["event"] == "kill"].iloc[0]
        restarts = events[events["event"] == "start"]
        after = steps_df[steps_df["restart"] > 0]
        first_after = after.iloc[0]
        resumed_from = int(first_after["resumed_from"])
        regained = after[after["step"] >= int(kill["step"])].iloc[0]
        step_s = float(ref["t"].diff().median()) if len(ref) > 2 else None
        final_equal = ref["loss_hex"].iloc[-1] == steps_df["loss_hex"].iloc[-1]
        return {
            "config": {"steps": steps, "ckpt_every": every, "nproc": nproc, "step_sleep_s": step_sleep,
                       "kill_step": kill_step, "max_restarts": 2, "rdzv": "c10d on 127.0.0.1",
                       "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
            "restarts": int(restarts["restart"].max()),
            "killed_after_step": int(kill["step"]), "resumed_from": resumed_from,
            "steps_lost": int(kill["step"]) - resumed_from,
            "recovery_s": round(float(first_after["t"]) - float(kill["t"]), 3),
            "time_to_regain_s": round(float(regained["t"]) - float(kill["t"]), 3),
            "final_loss_equal": bool(final_equal),
            "final_loss": float(steps_df["loss"].iloc[-1]), "reference_final_loss": float(ref["loss"].iloc[-1]),
            "reference_step_s": step_s, "wall_s": round(wall, 2),
            "agent_log_tail": "\n".join(out.splitlines()[-8:]),
        }
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


# --- the shrink: a node lost, the job goes on with one ----------------------------------------------

def rdzv_host() -> str:
    """The rendezvous address: ``RDZV_HOST``, else (in a Slurm allocation) the first node's
    ``NodeAddr`` (a node name need not resolve: two "nodes" on one host share 127.0.0.1), else
    127.0.0.1."""
    if os.environ.get("RDZV_HOST"):
        return os.environ["RDZV_HOST"]
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return "127.0.0.1"
    first = first_slurm_host(nodelist)
    try:
        out = subprocess.run(["scontrol", "show", "node", first], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return first
    addr = [tok.split("=", 1)[1] for tok in out.split() if tok.startswith("NodeAddr=")]
    return addr[0] if addr else first


def agent_cmd(endpoint: str, run_id: str, ckpt_dir: Path, log: Path, steps: int, every: int,
              *extra: str) -> list[str]:
    """One node's torchrun agent of the shrink: ``--nnodes=1:2``, c10d, up to 3 restarts, 1 worker."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=1",
            "--max-restarts=3", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}",
            "--monitor-interval=0.5", "-m", "preflight.harness.trainloop", "--ckpt-dir", str(ckpt_dir),
            "--losses", str(log), "--steps", str(steps), "--ckpt-every", str(every), "--log-samples", *extra]


def _rdzv_conf(node: int | str) -> str:
    """The agent's ``--rdzv-conf``: node 0 hosts the rendezvous store (``SHRINK_RDZV_CONF`` besides)."""
    return f"{SHRINK_RDZV_CONF},is_host={'true' if str(node) == '0' else 'false'}"


def _run_agents(cmd: list[str], env: dict, nodes: int, timeout: float) -> str:
    """Start one agent per node and wait for all: under srun in an allocation of >= ``nodes`` nodes,
    else as local processes. The launcher's name is returned."""
    in_allocation = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1) >= nodes
    if in_allocation and shutil.which("srun"):
        # --kill-on-bad-exit=0: a lost node must not take the survivor down with it
        wrapper = (f'h=false; [ "$SLURM_NODEID" = 0 ] && h=true; '
                   f'export PET_RDZV_CONF="{SHRINK_RDZV_CONF},is_host=$h"; exec "$@"')
        procs = [subprocess.Popen(["srun", f"--nodes={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
                                   "bash", "-c", wrapper, "agent", *cmd], env=env, start_new_session=True)]
        launcher = f"srun, {nodes} Slurm nodes"
    else:
        procs = [subprocess.Popen(cmd, env=dict(env, PREFLIGHT_NODE=str(i), PET_RDZV_CONF=_rdzv_conf(i)),
                                  start_new_session=True) for i in range(nodes)]
        launcher = f"local agents, {nodes} on this machine"
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"the shrink run did not finish within {timeout:.0f} s: {' '.join(cmd)}") from None
    finally:
        for p in procs:               # the whole tree of each launcher, also after a timeout
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
            p.wait()
    return launcher


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def shrink_results(ref_log: Path, run_log: Path, after_log: Path) -> dict:
    """The shrink's figures from three trainloop logs: the uninterrupted 2-rank run, the run that lost
    a node, and the 1-rank run resumed from the same checkpoint (see the module docstring)."""
    from preflight.harness.trainloop import read_log

    rows = _rows(run_log)
    steps = [r for r in rows if "event" not in r]
    kill = next(r for r in rows if r.get("event") == "kill")
    starts = [r for r in rows if r.get("event") == "start"]
    after = [r for r in steps if r["restart"] > 0]
    before = [r for r in steps if r["restart"] == 0]
    first_after = after[0]
    resumed_from = int(first_after["resumed_from"])
    ref = {r["step"]: r for r in _rows(ref_log) if "event" not in r}
    again = {r["step"]: r for r in _rows(after_log) if "event" not in r}
    effective, _ = read_log(run_log)                  # the last value of each step: what the model saw
    seen = [(int(r.epoch), int(s)) for r in effective.itertuples() for s in r.samples]
    ref_seq = [(int(r["epoch"]), int(s)) for _, r in sorted(ref.items()) for s in r["samples"]]
    final = effective.iloc[-1]
    return {
        "world_before": int(before[0]["world"]), "world_after": int(first_after["world"]),
        "killed_after_step": int(kill["step"]), "killed_node": kill.get("node"),
        "survivor_node": starts[-1].get("node"), "restarts": max(int(s["restart"]) for s in starts),
        "resumed_from": resumed_from, "steps_lost": int(kill["step"]) - resumed_from,
        "recovery_s": round(first_after["t"] - kill["t"], 3),
        "restart_s": round(starts[-1]["t"] - kill["t"], 3),
        "time_to_regain_s": round(next(r["t"] for r in after if r["step"] >= kill["step"]) - kill["t"], 3),
        "samples_trained": len(seen),
        "samples_repeated": len(seen) - len(set(seen)),
        "samples_lost": len(set(ref_seq[:len(seen)]) - set(seen)),
        "same_order_as_uninterrupted": seen == ref_seq[:len(seen)],
        "before_change_equal": all(r["loss_hex"] == ref[r["step"]]["loss_hex"] for r in before),
        "steps_compared_before": len(before),
        "after_change_equal": all(r["loss_hex"] == again[r["step"]]["loss_hex"] for r in after),
        "steps_compared_after": len(after),
        "final_loss": float(final["loss"]), "uninterrupted_final_loss": float(ref[max(ref)]["loss"]),
        "final_loss_equal_to_uninterrupted": final["loss_hex"] == ref[max(ref)]["loss_hex"],
    }


def measure_shrink(workdir: str | os.PathLike | None = None, steps: int = 120, every: int = 10,
                   kill_step: int = 45, step_sleep: float = 0.05, quick: bool = False) -> dict:
    """The uninterrupted 2-rank run, the 2-node run that loses node 1 after ``kill_step``, and the
    1-rank run from the checkpoint the survivor resumed from; ``shrink_results`` of the three."""
    if quick:
        steps, every, kill_step = 60, 10, 25
    own = workdir is None
    work = Path(workdir or tempfile.mkdtemp(prefix="preflight-shrink-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", PYTHONUNBUFFERED="1",
               CUDA_VISIBLE_DEVICES="")
    env.pop("PREFLIGHT_NODE", None)
    try:
        _run(torchrun_cmd(work / "ref", work / "ref.jsonl", steps, every, 2, 0, "--log-samples"))
        endpoint = f"{rdzv_host()}:{int(os.environ.get('RDZV_PORT') or free_port())}"
        t0 = time.perf_counter()
        launcher = _run_agents(agent_cmd(endpoint, f"preflight-shrink-{os.getpid()}", work / "run", work / "run.jsonl",
                                         steps, every, "--keep", "1000", "--kill-node-at-step", str(kill_step),
                                         "--kill-node", "1", "--step-sleep", str(step_sleep)), env, 2, TIMEOUT_S)
        wall = time.perf_counter() - t0
        if not (work / "run" / "DONE").exists():
            raise RuntimeError(f"the shrink run did not finish its {steps} steps (no DONE in {work / 'run'})")
        resumed = next(r for r in _rows(work / "run.jsonl") if "event" not in r and r["restart"] > 0)["resumed_from"]
        from preflight.toolkit import ckpt

        ckpt.copy_checkpoint(work / "run" / ckpt.step_name(resumed), work / "after")
        subprocess.run([sys.executable, "-m", "preflight.harness.trainloop", "--ckpt-dir", str(work / "after"),
                        "--losses", str(work / "after.jsonl"), "--steps", str(steps), "--ckpt-every", str(every),
                        "--log-samples"], env={k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE")},
                       check=True, capture_output=True, timeout=TIMEOUT_S)
        res = shrink_results(work / "ref.jsonl", work / "run.jsonl", work / "after.jsonl")
        res.update(launcher=launcher, wall_s=round(wall, 2),
                   config={"steps": steps, "ckpt_every": every, "kill_step": kill_step, "step_sleep_s": step_sleep,
                           "nnodes": "1:2", "nproc_per_node": 1, "max_restarts": 3, "rdzv": f"c10d on {endpoint}",
                           "rdzv_conf": SHRINK_RDZV_CONF, "per_rank_batch": 32})
        return res
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preflight.bench.elastic", description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default=None, help="where the runs write (default: a temporary folder, removed)")
    ap.add_argument("--quick", action="store_true", help="fewer steps: a smoke test")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--out", help="results folder for the versioned record (elastic.json, elastic_shrink.json)")
    ap.add_argument("--shrink", action="store_true", help="a node lost: 2 agents (--nnodes=1:2), one killed")
    a = ap.parse_args(argv)
    method = SHRINK if a.shrink else METHOD
    res = (measure_shrink if a.shrink else measure_elastic)(a.workdir, quick=a.quick)
    if a.out:
        from preflight.core.records import save_record

        path = save_record(method.record({"quick": a.quick}, res), a.out)
        print(f"record -> {path}", file=sys.stderr if a.json else sys.stdout)
    if a.json:
        print(json.dumps(res, indent=1))
    elif a.shrink:
        print(f"{res['launcher']}: node {res['killed_node']} lost after step {res['killed_after_step']}; world "
              f"{res['world_before']} -> {res['world_after']}, resumed from {res['resumed_from']} "
              f"({res['steps_lost']} steps lost), training again after {res['recovery_s']:.1f} s; samples lost "
              f"{res['samples_lost']}, repeated {res['samples_repeated']}")
    else:
        print(f"killed after step {res['killed_after_step']}, resumed from {res['resumed_from']} "
              f"({res['steps_lost']} steps lost), training again after {res['recovery_s']:.1f} s; "
              f"final loss bitwise equal: {res['final_loss_equal']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
