"""When to stop a distributed training: rank 0 looks, every rank learns, for < 0.1 % of a step.

A job asked to stop (the Slurm template's ``STOP`` file at the walltime warning, or SIGUSR1 /
SIGTERM) must stop after the *same* step on every rank, or the next collective waits forever for the
ranks that left. The obvious way, every rank ``stat``-ing the file after every step and then an
all-reduce of a CPU flag followed by ``.item()``, costs at 1024 ranks 1024 metadata operations per
step on the shared file system (a ``stat`` on Lustre or GPFS is a round trip to the metadata server,
from ~0.1 ms to many ms under load, and every rank's request queues behind the others'), a blocking
collective plus a host synchronisation every step, and a CPU tensor that NCCL cannot reduce at all.

Here only rank 0 looks (at the file and at its own signal flag: Slurm signals every task, rank 0's
included), and only every ``k`` steps; the decision goes to every rank as a tensor on the training
device (``cuda`` under NCCL, ``cpu`` under gloo) in one ``broadcast``, at steps every rank knows in
advance because the tensor also carries the next ``k``. ``k`` comes from two measured times::

    k = ceil(check_s / (BUDGET * step_s))      BUDGET = 0.001

``check_s``: what the last check cost on rank 0 (the ``stat``, the broadcast and the ``.item()``
that waits for it); ``step_s``: the median time between calls since the last check (one step of
training). A check every ``k`` steps then costs ``check_s / (k * step_s) <= 0.1 %`` of the time.
Capped so that a request waits at most ``MAX_DELAY_S`` of training: ``k <= max(1, MAX_DELAY_S //
step_s)`` (Slurm's warning comes 30-90 s before the limit and the save needs time too); only a
check dearer than ``BUDGET * MAX_DELAY_S`` (5 ms) can then cost more than the budget. The first check
is after step 1, before anything is measured.

Examples: a 1 s step and a 0.2 ms check: ``k = 1``. A 20 ms step and a 0.5 ms check: ``k = 25``
(a check every half second).
"""
from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

BUDGET = 0.001          # a check may cost this share of the training time
MAX_DELAY_S = 5.0       # ... and a stop request waits at most this long (of training) to be seen


def poll_interval(check_s: float, step_s: float, budget: float = BUDGET, max_delay_s: float = MAX_DELAY_S) -> int:
    """Steps between two checks: ``ceil(check_s / (budget * step_s))``, at least 1, at most
    ``max(1, floor(max_delay_s / step_s))`` (see the module docstring)."""
    if step_s <= 0:
        return 1
    k = math.ceil(check_s / (budget * step_s))
    cap = max(1, math.floor(max_delay_s / step_s + 1e-9))      # + 1e-9: 5 / 0.001 is 4999.999...
    return max(1, min(k, cap))


class StopPoller:
    """Call :meth:`should_stop` after every step on every rank; it answers the same on all of them.

    ``device``: where the decision tensor lives (the device the model trains on); ``world``: ranks in
    the default process group (1: no collective at all). ``checks`` and ``k`` are kept for the log.
    """

    def __init__(self, stop_file: str | Path, rank: int, world: int, device="cpu",
                 budget: float = BUDGET, max_delay_s: float = MAX_DELAY_S):
        self.stop_file = Path(stop_file)
        self.rank, self.world, self.device = rank, world, device
        self.budget, self.max_delay_s = budget, max_delay_s
        self.next_check = 1            # the step after which the next check runs (the same on all ranks)
        self.k = 1
        self.checks = 0
        self.check_s = 0.0
        self._last_call: float | None = None
        self._intervals: list[float] = []

    def should_stop(self, step: int, requested: bool = False) -> bool:
        """True (on every rank, after the same step) once rank 0 saw the stop file or ``requested``.

        ``requested`` counts on rank 0 only (its signal flag); other ranks' flags are not gathered."""
        now = time.perf_counter()
        if self._last_call is not None:
            self._intervals.append(now - self._last_call)
        self._last_call = now
        if step < self.next_check:
            return False
        t0 = time.perf_counter()
        stop = 0.0
        if self.rank == 0:
            stop = float(requested or self.stop_file.exists())
            step_s = statistics.median(self._intervals) if self._intervals else 0.0
            self.k = poll_interval(self.check_s, step_s, self.budget, self.max_delay_s)
        if self.world > 1:
            import torch
            import torch.distributed as dist

            flag = torch.tensor([stop, float(self.k)], dtype=torch.float64, device=self.device)
            dist.broadcast(flag, src=0)
            stop, k = flag.tolist()          # the host sync: every rank has rank 0's answer
            self.k = int(k)
        self.checks += 1
        self.check_s = time.perf_counter() - t0
        self.next_check = step + self.k
        self._intervals.clear()
        self._last_call = time.perf_counter()      # the check itself is not part of the next step
        return bool(stop)
