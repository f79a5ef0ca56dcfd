"""A small real training run whose full state survives any interruption, bit for bit.

Every piece of state that changes what the next step computes is checkpointed:

- model weights, AdamW moments, LR scheduler position (warm-up + cosine),
- every random generator: Python ``random`` (feature masking), NumPy (input noise), torch CPU
  (dropout) and CUDA, one set per rank,
- the data iterator: the shuffling generator's state at the start of the epoch, the epoch, and the
  position in its permutation, in samples (a resume rebuilds the same permutation and goes on from
  there, also at another world size: an elastic shrink neither drops nor repeats a sample).

Leave one out (``--omit rng|data|optimizer|scheduler``) and the resumed loss curve departs from the
uninterrupted one: chapter 5 plots by how much.

Runnable alone, under torchrun (DDP on gloo/NCCL; each rank's RNG state is gathered into the one
checkpoint) and under Slurm (``preflight/slurm/walltime_requeue.sbatch``)::

    python -m preflight.harness.trainloop --ckpt-dir ck --steps 200 --ckpt-every 20 --losses losses.jsonl

It resumes from the newest valid checkpoint in ``--ckpt-dir`` (and ``--shared-dir``), appends one
JSON line per step to ``--losses`` (rank 0), and stops cleanly on request: on SIGUSR1/SIGTERM or when
the file ``<ckpt-dir>/STOP`` appears (what the Slurm template's trap creates: torchrun does not
forward SIGUSR1 to its workers), it saves a checkpoint and exits 0; rank 0 checks, every k steps, and
broadcasts the decision (``preflight.toolkit.stoppoll``: k keeps the check under 0.1 % of a step). When
all steps are done it saves, writes ``<ckpt-dir>/DONE`` and exits 0. ``--kill-at-step`` makes one
rank SIGKILL itself on the first attempt (a worker lost: the elastic restart); ``--kill-node-at-step``
makes the workers of one node SIGKILL their torchrun agent and themselves (a node lost: the elastic
shrink; the node's index comes from ``PREFLIGHT_NODE`` or Slurm's ``SLURM_NODEID``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from preflight.toolkit import ckpt
from preflight.toolkit.stoppoll import StopPoller

PARTS = ("rng", "data", "optimizer", "scheduler")
DIM, HIDDEN, SAMPLES = 32, 128, 1024
_stop_requested = False


def _request_stop(signum, frame):  # noqa: ARG001
    global _stop_requested
    _stop_requested = True


def restart_count() -> int:
    """How many times torchrun restarted the workers of this job (0 outside torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def requeue_count() -> int:
    """How many times Slurm requeued this job (0 outside Slurm)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def node_index() -> int:
    """This worker's node in the job: ``PREFLIGHT_NODE`` (set by a launcher that starts several agents
    on one machine), else Slurm's ``SLURM_NODEID``, else 0."""
    return int(os.environ.get("PREFLIGHT_NODE") or os.environ.get("SLURM_NODEID") or 0)


def node_name() -> str:
    """The Slurm node name (two "nodes" can share a host), else the host name."""
    import socket

    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def make_data(seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed synthetic regression set (independent of the training RNGs)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, DIM, generator=g)
    w = torch.randn(DIM, 1, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.sin(3 * x[:, :1]) + 0.05 * torch.randn(SAMPLES, 1, generator=g)
    return x, y


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(DIM, HIDDEN), nn.GELU(), nn.Dropout(0.1),
                         nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Dropout(0.1), nn.Linear(HIDDEN, 1))


def lr_lambda(total_steps: int, warmup: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total_steps - warmup))))
    return f


def augment(x: torch.Tensor) -> torch.Tensor:
    """Input noise from NumPy's global generator and one masked feature chosen by Python's
    ``random``: two more generators a resume must restore."""
    noise = torch.from_numpy(np.random.normal(0.0, 0.02, size=tuple(x.shape)).astype(np.float32))
    x = x + noise
    x[:, random.randrange(x.shape[1])] = 0.0
    return x


def rng_state() -> dict:
    np_state = np.random.get_state()
    state = {"python": random.getstate(),
             # numpy's key array as a list: torch.load(weights_only=True) refuses ndarrays
             "numpy": [np_state[0], np_state[1].tolist(), np_state[2], np_state[3], np_state[4]],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(_tuples(state["python"]))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


class Trainer:
    """The run: model, optimiser, scheduler, shuffled loader with augmentation and dropout."""

    def __init__(self, steps: int, seed: int = 0, batch_size: int = 32, lr: float = 3e-3,
                 rank: int = 0, world: int = 1):
        self.steps, self.seed, self.batch_size, self.rank, self.world = steps, seed, batch_size, rank, world
        torch.manual_seed(seed)                       # same initial weights on every rank
        self.model = make_model()
        self.ddp = None
        if world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP
            self.ddp = DDP(self.model)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.01)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(steps, max(1, steps // 10)))
        self.x, self.y = make_data()
        # per-rank training randomness, seeded once; restored from the checkpoint on resume
        random.seed(seed * 1000 + rank)
        np.random.seed(seed * 1000 + rank)
        torch.manual_seed(seed * 1000 + rank)
        self.shuffle = torch.Generator().manual_seed(seed)   # the same permutation on every rank
        self.step = 0
        self.epoch = 0
        self.epoch_start_shuffle = self.shuffle.get_state()
        self.position = 0              # samples of this epoch's permutation already trained on (all ranks)
        self.last_samples: list[int] = []                   # the global batch of the last step
        self._batches = None

    @property
    def batches_per_epoch(self) -> int:
        return SAMPLES // (self.batch_size * self.world)

    def _epoch_batches(self):
        """This epoch's permutation (drawn from the shuffle generator) from ``position`` on, in global
        batches of ``batch_size * world`` samples, this rank's share of each (the last partial batch is
        dropped). Positions count samples, not batches, so a resume at another world size goes on
        exactly where the checkpoint stopped."""
        perm = torch.randperm(SAMPLES, generator=self.shuffle)
        per = self.batch_size * self.world
        while self.position + per <= SAMPLES:
            batch = perm[self.position:self.position + per]
            self.position += per
            self.last_samples = batch.tolist()
            idx = batch[self.rank::self.world]
            yield self.x[idx], self.y[idx]

    def next_batch(self):
        if self._batches is None:
            self.shuffle.set_state(self.epoch_start_shuffle)
            self._batches = self._epoch_batches()
        try:
            batch = next(self._batches)
        except StopIteration:
            self.epoch += 1
            self.position = 0
            self.epoch_start_shuffle = self.shuffle.get_state()
            self._batches = self._epoch_batches()
            batch = next(self._batches)
        return batch

    def train_step(self) -> float:
        self.model.train()
        x, y = self.next_batch()
        out = (self.ddp or self.model)(augment(x.clone()))
        loss = nn.functional.mse_loss(out, y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.sched.step()
        self.step += 1
        return float(loss.detach())

    def state(self) -> dict:
        """The full state of this rank (the caller gathers the per-rank parts)."""
        return {"step": self.step, "model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                "scheduler": self.sched.state_dict(),
                "data": {"epoch": self.epoch, "position": self.position,
                         "epoch_start_shuffle": self.epoch_start_shuffle},
                "rng": rng_state()}

    def load(self, state: dict, omit: frozenset = frozenset()) -> None:
        """Restore ``state``; ``omit`` leaves parts out on purpose (what breaks a resume)."""
        self.step = state["step"]
        self.model.load_state_dict(state["model"])
        if "optimizer" not in omit:
            self.opt.load_state_dict(state["optimizer"])
        if "scheduler" not in omit:
            self.sched.load_state_dict(state["scheduler"])
            for g, lr in zip(self.opt.param_groups, self.sched.get_last_lr()):
                g["lr"] = lr
        else:                      # a fresh scheduler: warm-up starts again at the resumed step
            for g in self.opt.param_groups:
                g["lr"] = g["initial_lr"] * self.sched.lr_lambdas[0](0)
        if "data" not in omit:
            d = state["data"]
            self.epoch, self.position, self.epoch_start_shuffle = d["epoch"], d["position"], d["epoch_start_shuffle"]
        self._batches = None
        rng = state["rng"][self.rank] if isinstance(state["rng"], list) else state["rng"]
        if "rng" not in omit:
            set_rng_state(rng)


def _gather_state(tr: Trainer) -> dict | None:
    """Rank 0's state with every rank's RNG state in a list (None on other ranks)."""
    s = tr.state()
    if tr.world == 1:
        s["rng"] = [s["rng"]]
        return s
    import torch.distributed as dist

    rngs = [None] * tr.world
    dist.all_gather_object(rngs, s["rng"])
    s["rng"] = rngs
    return s if tr.rank == 0 else None


def read_log(path: str | os.PathLike):
    """The log as two DataFrames: steps (step, loss, loss_hex, t, restart, resumed_from) and events
    (start, checkpoint, kill, stopped, done). A step logged twice (recomputed after a resume) keeps
    its last value."""
    import pandas as pd

    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    steps = pd.DataFrame([r for r in rows if "event" not in r])
    events = pd.DataFrame([r for r in rows if "event" in r])
    if len(steps):
        steps = steps.drop_duplicates("step", keep="last").sort_values("step").reset_index(drop=True)
    return steps, events


def _log(path: Path | None, record: dict) -> None:
    if path is None:
        return
    with open(path, "a") as f:                 # one short line per write: appends do not interleave
        f.write(json.dumps(record) + "\n")


def run(args: argparse.Namespace) -> int:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.set_num_threads(1)
    if world > 1:      # the model is small and stays on the CPU: gloo, on any machine
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world)
    signal.signal(signal.SIGUSR1, _request_stop)
    signal.signal(signal.SIGTERM, _request_stop)
    ckdir = Path(args.ckpt_dir)
    ckdir.mkdir(parents=True, exist_ok=True)
    log = Path(args.losses) if args.losses and rank == 0 else None
    omit = frozenset(p for p in (args.omit or "").split(",") if p)
    saver = ckpt.TwoStageCheckpointer(ckdir, args.shared_dir, keep=args.keep)

    tr = Trainer(args.steps, seed=args.seed, batch_size=args.batch_size, rank=rank, world=world)
    resumed_from = 0
    t_start = time.time()
    found = saver.load_latest()
    if found:
        resumed_from, state, folder = found
        tr.load(state, omit)
    _log(log, {"event": "start", "t": t_start, "resumed_from": resumed_from, "restart": restart_count(),
               "requeue": requeue_count(), "world": world, "omit": sorted(omit), "pid": os.getpid(),
               "node": node_name()})

    def checkpoint(blocking: bool) -> None:
        s = _gather_state(tr)
        if rank == 0:
            stall = saver.save(s, tr.step, blocking=blocking or not args.shared_dir)
            _log(log, {"event": "checkpoint", "step": tr.step, "stall_s": stall, "t": time.time()})

    any_log = Path(args.losses) if args.losses else None     # the few lines every rank writes
    poller = StopPoller(ckdir / "STOP", rank, world, device=next(tr.model.parameters()).device)
    first_attempt = restart_count() == 0 and not resumed_from
    status = "done"
    while tr.step < args.steps:
        loss = tr.train_step()
        row = {"step": tr.step, "loss": loss, "loss_hex": loss.hex(), "t": time.time(), "restart": restart_count(),
               "requeue": requeue_count(), "resumed_from": resumed_from, "world": world, "epoch": tr.epoch}
        if args.log_samples:
            row["samples"] = tr.last_samples
        _log(log, row)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if args.kill_at_step == tr.step and rank == args.kill_rank and first_attempt:
            _log(any_log, {"event": "kill", "step": tr.step, "t": time.time(), "rank": rank})
            os.kill(os.getpid(), signal.SIGKILL)
        if args.kill_node_at_step == tr.step and node_index() == args.kill_node and first_attempt:
            _log(any_log, {"event": "kill", "step": tr.step, "t": time.time(), "rank": rank, "node": node_name(),
                           "agent_pid": os.getppid()})
            os.kill(os.getppid(), signal.SIGKILL)          # the torchrun agent: the node is gone
            os.kill(os.getpid(), signal.SIGKILL)
        # every rank must agree, or the collectives of the next step hang: rank 0 decides
        stop = poller.should_stop(tr.step, _stop_requested)
        if tr.step % args.ckpt_every == 0 or stop or tr.step == args.steps:
            checkpoint(blocking=stop or tr.step == args.steps)
        if stop and tr.step < args.steps:
            status = "stopped"
            break
    saver.wait()
    if rank == 0 and status == "done":
        (ckdir / "DONE").write_text(json.dumps({"step": tr.step, "t": time.time()}))
    end = {"event": status, "step": tr.step, "t": time.time(), "restart": restart_count(), "rank": rank,
           "node": node_name(), "stop_checks": poller.checks, "stop_every": poller.k}
    _log(any_log if status == "stopped" else log, end)       # a stop: every rank says it saw it
    if world > 1:
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()
    return 0


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m preflight.harness.trainloop", description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt-dir", required=True, help="checkpoint folder (fast local disk)")
    ap.add_argument("--shared-dir", default=None, help="second stage: copy each checkpoint here in the background")
    ap.add_argument("--steps", type=int, required=True, help="total training steps (1..10^7)")
    ap.add_argument("--ckpt-every", type=int, default=20, help="checkpoint interval, steps (>= 1)")
    ap.add_argument("--keep", type=int, default=3, help="checkpoints kept (>= 1)")
    ap.add_argument("--losses", default=None, help="JSON-lines file: one line per step (appended)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank, 1..256")
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep after each step (0..60)")
    ap.add_argument("--omit", default="", help=f"comma-separated parts NOT restored on resume: {','.join(PARTS)}")
    ap.add_argument("--kill-at-step", type=int, default=0, help="SIGKILL one rank after this step (first attempt only)")
    ap.add_argument("--kill-rank", type=int, default=0, help="the rank --kill-at-step kills")
    ap.add_argument("--kill-node-at-step", type=int, default=0,
                    help="after this step (first attempt only), the workers of node --kill-node SIGKILL their "
                         "torchrun agent and themselves: a node lost")
    ap.add_argument("--kill-node", type=int, default=1, help="the node --kill-node-at-step kills (PREFLIGHT_NODE "
                                                            "or SLURM_NODEID)")
    ap.add_argument("--log-samples", action="store_true", help="log each step's global batch (sample indices)")
    a = ap.parse_args(argv)
    checks = [("--steps", a.steps, 1, 10**7), ("--ckpt-every", a.ckpt_every, 1, 10**7), ("--keep", a.keep, 1, 1000),
              ("--batch-size", a.batch_size, 1, 256), ("--step-sleep", a.step_sleep, 0, 60),
              ("--kill-at-step", a.kill_at_step, 0, 10**7), ("--kill-node-at-step", a.kill_node_at_step, 0, 10**7)]
    for name, v, lo, hi in checks:
        if not lo <= v <= hi:
            ap.error(f"{name} = {v}: accepted {lo} .. {hi}")
    bad = [p for p in a.omit.split(",") if p and p not in PARTS]
    if bad:
        ap.error(f"--omit = {a.omit!r}: unknown part(s) {bad}; accepted: {', '.join(PARTS)}")
    if SAMPLES // a.batch_size < int(os.environ.get("WORLD_SIZE", 1)):
        ap.error(f"--batch-size = {a.batch_size}: too large for {SAMPLES} samples over the ranks")
    return a


def main(argv=None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    from preflight.harness.launch import exit_worker

    exit_worker(main)
