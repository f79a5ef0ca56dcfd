"""A workload checked before any chapter runs: one batch, one forward/backward, one optimizer step.

``check(workload, device)`` runs the contract of ``preflight.core.workload`` for real: ``batch()`` gives a
pair of CPU tensors (or tuples of them) whose first input has the samples as its first dimension,
the forward runs, the loss is a finite scalar that depends on the parameters, backward runs, the
optimizer is a ``torch.optim.Optimizer`` and steps. Out of memory on the device is named as such:
the workload does not fit. Every problem is a ``WorkloadError`` naming the workload.

``preflight_check`` runs ``load`` + ``check`` in a fresh subprocess (``python -m
preflight.runner.workload_check ENTRY --base DIR``) with a timeout: the audit calls it before any chapter,
so that a hang or a crash in the user's code costs seconds and a message, not a chapter or the audit.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from preflight.core.workload import Workload, WorkloadError, _where, load, samples_in, to_device

CHECK_TIMEOUT_S = 300


def _tensors(x, what: str, entry: str) -> list:
    import torch

    items = list(x) if isinstance(x, (tuple, list)) else [x]
    if not items:
        raise WorkloadError(f"workload {entry}: batch() {what} are empty")
    for t in items:
        if not isinstance(t, torch.Tensor):
            raise WorkloadError(f"workload {entry}: batch() {what} hold a {type(t).__name__}; expected tensors "
                                "(or a tuple of tensors)")
        if t.device.type != "cpu":
            raise WorkloadError(f"workload {entry}: batch() returned a tensor on {t.device}; return CPU tensors "
                                "(Preflight moves them to the device)")
    return items


def check(wl: Workload, device="cpu") -> dict:
    """One batch, one forward/backward, one optimizer step on ``device``; every problem a
    ``WorkloadError``. Returns what was seen (samples, loss, parameters that got a gradient)."""
    import torch

    entry = wl.entry

    def call(what: str, fn):
        try:
            return fn()
        except torch.cuda.OutOfMemoryError:
            raise WorkloadError(f"workload {entry}: {wl.label} does not fit the device ({device}): out of memory "
                                f"in {what}; make the batch or the model smaller") from None
        except MemoryError:
            raise WorkloadError(f"workload {entry}: out of host memory in {what}") from None
        except WorkloadError:
            raise
        except Exception as err:  # noqa: BLE001 - the user's code failing is a message
            raise WorkloadError(f"workload {entry}: {what} raised {_where(err)}") from None

    out = call("batch()", wl.batch)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise WorkloadError(f"workload {entry}: batch() returned a {type(out).__name__}; expected a pair "
                            "(inputs, targets)")
    inputs, targets = out
    first = _tensors(inputs, "inputs", entry)[0]
    _tensors(targets, "targets", entry)
    if first.dim() == 0 or first.shape[0] < 1:
        raise WorkloadError(f"workload {entry}: the first input has shape {tuple(first.shape)}; its first "
                            "dimension must be the samples of the batch")
    wl.model.to(device).train()
    x, y = to_device(inputs, device), to_device(targets, device)
    outputs = call(f"the forward of {wl.name}", lambda: wl.forward(x))
    loss = call("loss(outputs, targets)", lambda: wl.loss(outputs, y))
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        what = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else f"a {type(loss).__name__}"
        raise WorkloadError(f"workload {entry}: loss returned {what}; expected a scalar floating-point tensor")
    if not loss.requires_grad:
        raise WorkloadError(f"workload {entry}: the loss does not depend on the model's parameters (no gradient)")
    if not torch.isfinite(loss.detach()).all():
        raise WorkloadError(f"workload {entry}: the loss of the first batch is {float(loss)} (not finite)")
    call("backward", loss.reshape(()).backward)
    with_grad = sum(p.numel() for p in wl.model.parameters() if p.grad is not None)
    opt = call("optimizer(params)", wl.make_optimizer)
    if not isinstance(opt, torch.optim.Optimizer):
        raise WorkloadError(f"workload {entry}: optimizer returned a {type(opt).__name__}; expected a "
                            "torch.optim.Optimizer")
    call("optimizer.step()", opt.step)
    return {**wl.describe(), "samples": samples_in(inputs), "loss": float(loss.detach()), "params_with_grad": with_grad,
            "tokens_per_sample": wl.tokens_per_sample, "blocks": list(wl.blocks), "device": str(device)}


def preflight_check(entry: str, base_dir: str | os.PathLike | None = None, timeout_s: float = CHECK_TIMEOUT_S,
                    device: str | None = None) -> dict:
    """``load`` + ``check`` in a fresh subprocess (``python -m preflight.core.workload``), with a timeout:
    the audit's check before any chapter runs. Returns ``check``'s dict; raises ``WorkloadError``."""
    cmd = [sys.executable, "-m", "preflight.runner.workload_check", entry, "--base", str(base_dir or ".")]
    cmd += ["--device", device] if device else []
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise WorkloadError(f"workload {entry}: import, build and one training step on one batch did not finish "
                            f"in {timeout_s:g} s (a hang, or a batch far too large for this machine)") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    try:
        answer = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise WorkloadError(f"workload {entry}: the check process died (exit {proc.returncode}): {tail}") from None
    if not answer.get("ok"):
        raise WorkloadError(answer["error"])
    return answer["seen"]


def main(argv: list[str] | None = None) -> int:
    """The check in its own process: one JSON line on stdout, ``{"ok": true, "seen": {...}}`` or
    ``{"ok": false, "error": "..."}``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m preflight.runner.workload_check", description="check a workload entry point")
    ap.add_argument("entry")
    ap.add_argument("--base", default=".", help="folder a file entry is relative to (the profile's)")
    ap.add_argument("--device", default=None, help="default: this machine's accelerator, else the CPU")
    args = ap.parse_args(argv)
    try:
        from preflight.core.device import default_device

        seen = check(load(args.entry, args.base), args.device or default_device())
        answer = {"ok": True, "seen": seen}
    except WorkloadError as err:
        answer = {"ok": False, "error": str(err)}
    print(json.dumps(answer), flush=True)
    return 0 if answer["ok"] else 2


if __name__ == "__main__":
    sys.exit(main())
