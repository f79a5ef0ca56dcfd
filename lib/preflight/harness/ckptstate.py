"""What ``preflight.bench.ckptstall`` checkpoints, the four ways it saves, and how one save is timed.

A checkpoint benchmark needs three things that have nothing to do with its statistics:

- **A training state of a chosen size.** ``mlp_for(size_mb)`` sizes a ``din -> hidden -> din`` MLP
  so that its fp32 parameters plus AdamW's two moments (4 + 8 = 12 bytes per parameter) take
  ``size_mb`` MB; ``Trainer`` wraps it in a training loop on fixed data (one AdamW step per call,
  the first taken at construction so the moments exist before anything is saved). ``state_bytes``
  counts the tensor bytes of any nested state, ``folder_bytes`` what reached the disk.
- **The methods under test** (``METHODS``; ``ASYNC`` pairs each asynchronous one with its
  synchronous twin). ``Methods.start(name, t0)`` starts one checkpoint and returns ``(done,
  finish)``: ``done()`` is True once it is durable, ``finish()`` waits for it and returns the
  seconds from ``t0`` to durable. A synchronous save is durable on return; the two-stage one is in
  flight while ``TwoStageCheckpointer.in_flight`` says so; DCP's ``async_save`` while its future is
  not done. Bookkeeping (sizes on disk, pruning old DCP folders) happens in ``finish``, outside the
  stall.
- **The timing of one checkpoint** (``one_checkpoint``): the stall is the time the call keeps the
  training thread; then training goes on, each step timed, until the save is durable (at most
  ``MAX_INFLIGHT_S``), so the cost of the background write shows up as slower in-flight steps.

``quiet_dcp`` silences the warning DCP gives on every call without a process group.
"""
from __future__ import annotations

import contextlib
import shutil
import time
import warnings
from pathlib import Path

METHODS = ("sync ckpt.save", "async two-stage", "DCP save", "DCP async_save")
DESCRIPTIONS = {
    "sync ckpt.save": "torch.save + fsync + manifest + rename + publish to shared, in the training thread",
    "async two-stage": "snapshot to host memory; background: local durable write, copy to shared, publish",
    "DCP save": "torch.distributed.checkpoint.save to shared, in the training thread",
    "DCP async_save": "torch.distributed.checkpoint.async_save (thread): stage to CPU, write in a thread",
}
ASYNC = {"async two-stage": "sync ckpt.save", "DCP async_save": "DCP save"}     # async -> its sync pair
DIN, BATCH = 512, 64
MAX_INFLIGHT_S = 60.0        # keep training at most this long while a background save runs


def mlp_for(size_mb: float, din: int = DIN):
    """A ``din -> hidden -> din`` MLP whose parameters plus AdamW's two moments take ``size_mb`` MB
    (fp32: 12 bytes per parameter); returns ``(model, optimizer, hidden)``."""
    import torch
    from torch import nn

    params = size_mb * 1e6 / 12
    hidden = max(8, round((params - din) / (2 * din + 1)))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(din, hidden), nn.GELU(), nn.Linear(hidden, din))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4), hidden


def state_bytes(state) -> int:
    """Bytes of every tensor in a nested state."""
    import torch

    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Trainer:
    """The training loop being checkpointed: fixed data, one AdamW step per call."""

    def __init__(self, size_mb: float):
        import torch

        self.model, self.opt, self.hidden = mlp_for(size_mb)
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(BATCH, DIN, generator=gen)
        self.y = torch.randn(BATCH, DIN, generator=gen)
        self.step_no = 0
        self.step()                      # AdamW allocates its moments on the first step

    def step(self) -> float:
        import torch

        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(self.model(self.x), self.y).backward()
        self.opt.step()
        self.step_no += 1
        return time.perf_counter() - t0

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict(), "step": self.step_no}


class Methods:
    """Start one checkpoint of a method: ``start(name, t0)`` returns ``(done, finish)``: ``done()`` is
    True once the checkpoint is durable, ``finish()`` waits for it (re-raising a failure) and returns
    the seconds from ``t0`` (the call) to durable."""

    def __init__(self, trainer: Trainer, local: Path, shared: Path):
        from preflight.toolkit import ckpt

        self.trainer, self.local, self.shared = trainer, local, shared
        self.two_stage = ckpt.TwoStageCheckpointer(local / "two_stage", shared / "two_stage", keep=2)
        self.file_bytes: dict[str, int] = {}

    def start(self, name: str, t0: float):
        import torch.distributed.checkpoint as dcp

        from preflight.toolkit import ckpt

        state, step = self.trainer.state(), self.trainer.step_no
        if name == "sync ckpt.save":
            folder = ckpt.save(state, self.shared / "sync", step, keep=2)
            durable = time.perf_counter() - t0
            self.file_bytes[name] = folder_bytes(folder)
            return (lambda: True), (lambda: durable)
        if name == "async two-stage":
            cp = self.two_stage
            cp.save(state, step)
            returned = time.perf_counter() - t0

            def finish():
                cp.wait()
                self.file_bytes[name] = folder_bytes(self.shared / "two_stage" / ckpt.step_name(step))
                # last_durable_s runs from the start of the background write (after the snapshot)
                return returned + cp.last_durable_s

            return (lambda: not cp.in_flight), finish
        target = self.shared / name.replace(" ", "_").replace(".", "_") / f"step-{step:08d}"
        if name == "DCP save":
            dcp.save(state, checkpoint_id=target, no_dist=True)
            durable = time.perf_counter() - t0

            def finish_sync():
                self._dcp_done(name, target)          # bookkeeping, not timed
                return durable

            return (lambda: True), finish_sync
        fut = dcp.async_save(state, checkpoint_id=target, no_dist=True)
        done_at: list[float] = []
        fut.add_done_callback(lambda _f: done_at.append(time.perf_counter()))

        def finish():
            fut.result()
            self._dcp_done(name, target)
            return (done_at[0] if done_at else time.perf_counter()) - t0

        return fut.done, finish

    def _dcp_done(self, name: str, target: Path) -> None:
        """Record the size on disk and remove the older DCP checkpoints (outside the timed part;
        ``ckpt.save`` prunes inside it, as a training loop calling it would)."""
        self.file_bytes[name] = folder_bytes(target)
        for old in target.parent.iterdir():
            if old != target:
                shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def quiet_dcp():
    """DCP warns on every call without a process group that it assumes a single process: we know."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        yield


def one_checkpoint(methods: Methods, name: str, trainer: Trainer) -> dict:
    t0 = time.perf_counter()
    done, finish = methods.start(name, t0)
    stall = time.perf_counter() - t0
    inflight: list[float] = []
    while not done() and time.perf_counter() - t0 < MAX_INFLIGHT_S:
        inflight.append(trainer.step())
    t1 = time.perf_counter()
    durable = finish()
    return {"stall_s": stall, "durable_s": durable, "inflight": inflight, "drain_s": time.perf_counter() - t1}
