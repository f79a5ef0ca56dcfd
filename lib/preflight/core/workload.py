"""Your own model as the subject of the audit: the workload contract, loaded and checked.

Without a workload every live number describes Preflight's reference Transformer. With one, the
chapters measure *your* model instead. The profile names it::

    workload:
      entry: "my_workload.py:build"     # a .py file relative to the profile, or "package.module:build"

``build()`` takes no arguments and returns a mapping (or an object with these attributes):

==================== ========================================================================
``model``            a ``torch.nn.Module``
``batch``            a zero-argument callable returning ``(inputs, targets)``: CPU tensors, or
                     tuples of tensors; one training batch (Preflight moves it to the device)
``loss``             a callable ``(outputs, targets) -> scalar tensor``
``optimizer``        optional: ``params -> torch.optim.Optimizer`` (default AdamW, lr 1e-3)
``tokens_per_sample`` optional int: throughput in tokens/s (else samples/s)
``blocks``           optional: the ordered names of the submodules that form its layers (default:
                     the model's top-level children), for per-layer times and pipeline stages
==================== ========================================================================

One training step is always ``loss(model(*inputs), targets)`` (``model(inputs)`` for a single
tensor), backward, ``optimizer.step()``. The samples of a batch are the first dimension of the first
input tensor.

**Trust.** A workload is your own code: the audit imports it and runs it with your rights, like any
training script. It imports nothing the profile does not name. A file entry is imported with its
folder first on ``sys.path`` (so it can import its neighbours).

``load`` imports, seeds and builds, and checks the types above; ``preflight.runner.workload_check`` then
runs one training step on one batch, in a subprocess with a timeout, before any chapter runs. Every
problem raises ``WorkloadError`` with a message that names the workload and what is wrong.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

KEYS = ("model", "batch", "loss", "optimizer", "tokens_per_sample", "blocks")


class WorkloadError(ValueError):
    """A workload that cannot be used; ``str()`` names it and says what is wrong."""


@dataclass
class Workload:
    """A built workload: what ``build()`` returned, checked, plus how to run one step of it."""
    entry: str
    model: object                       # torch.nn.Module
    batch: Callable
    loss: Callable
    optimizer: Callable | None = None
    tokens_per_sample: int | None = None
    blocks: tuple[str, ...] = ()
    base_dir: str = "."                 # what a file entry is relative to (a child process loads it again)

    @property
    def name(self) -> str:
        return type(self.model).__name__

    @property
    def params(self) -> int:
        """Parameters, counted exactly (each shared tensor once, as ``model.parameters()`` yields it)."""
        return sum(p.numel() for p in self.model.parameters())

    def describe(self) -> dict:
        """What identifies it in a record's params and in findings: entry, class name, parameters."""
        return {"entry": self.entry, "class": self.name, "params": self.params}

    @property
    def label(self) -> str:
        """For messages: ``workload TinyLM (1,234,567 parameters)``."""
        return label(self.describe())

    def make_optimizer(self, params=None):
        """The workload's optimizer (default AdamW, lr 1e-3) over ``params`` (default: the model's)."""
        import torch

        params = self.model.parameters() if params is None else params
        return self.optimizer(params) if self.optimizer else torch.optim.AdamW(params, lr=1e-3)

    def forward(self, inputs, module=None):
        """``module(*inputs)`` for a tuple, ``module(inputs)`` for one tensor; ``module``: the model
        (default), or a wrapper of it (``torch.compile``, DDP)."""
        module = self.model if module is None else module
        return module(*inputs) if isinstance(inputs, (tuple, list)) else module(inputs)

    def step_loss(self, inputs, targets, module=None):
        """The loss of one batch (already on the model's device); backward is the caller's."""
        return self.loss(self.forward(inputs, module), targets)


def label(described: dict) -> str:
    """``workload TinyLM (1,234,567 parameters)`` from ``Workload.describe()`` (as a record keeps it)."""
    return f"workload {described['class']} ({described['params']:,} parameters)"


def samples_in(inputs) -> int:
    """Samples of a batch: the first dimension of its first input tensor."""
    first = inputs[0] if isinstance(inputs, (tuple, list)) else inputs
    return int(first.shape[0])


def to_device(x, device):
    """A tensor, or a tuple / list of them, moved to ``device``."""
    if isinstance(x, (tuple, list)):
        return type(x)(to_device(t, device) for t in x)
    return x.to(device, non_blocking=True)


def seed_all(seed: int = 0) -> None:
    """Python, NumPy and torch generators: the same build gives the same initial weights."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _where(err: BaseException) -> str:
    """``TypeError: message (my_workload.py:12)``: the error and the innermost frame that raised it."""
    frames = traceback.extract_tb(err.__traceback__)
    at = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300] if text else ''}{at}"


def find_build(entry: str, base_dir: str | os.PathLike | None = None) -> Callable:
    """Import the entry's module and return its build function. ``file.py:build`` is relative to
    ``base_dir`` (the profile's folder); ``package.module:build`` must be importable."""
    target, _, attr = entry.rpartition(":")
    if target.endswith(".py"):
        path = Path(target) if Path(target).is_absolute() else Path(base_dir or ".") / target
        if not path.is_file():
            raise WorkloadError(f"workload {entry}: file {path} not found (a file entry is relative to the profile)")
        name = "preflight_workload_" + "".join(c if c.isalnum() else "_" for c in path.stem)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(path.parent.resolve()))
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as err:  # noqa: BLE001 - the user's import failing is a message
            sys.modules.pop(name, None)
            raise WorkloadError(f"workload {entry}: importing {path.name} raised {_where(err)}") from None
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as err:
            raise WorkloadError(f"workload {entry}: module {err.name!r} not found (a package entry must be "
                                f"importable; for a file write 'file.py:{attr}')") from None
        except (Exception, SystemExit) as err:  # noqa: BLE001
            raise WorkloadError(f"workload {entry}: importing {target} raised {_where(err)}") from None
    if not hasattr(module, attr):
        raise WorkloadError(f"workload {entry}: {target} has no {attr!r}")
    build = getattr(module, attr)
    if not callable(build):
        raise WorkloadError(f"workload {entry}: {attr} is not callable (it is a {type(build).__name__})")
    return build


def load(entry: str, base_dir: str | os.PathLike | None = None, seed: int = 0) -> Workload:
    """Import, seed, ``build()``, and check what it returned (types only: nothing runs yet)."""
    import torch

    build = find_build(entry, base_dir)
    seed_all(seed)
    try:
        built = build()
    except BaseException as err:  # noqa: BLE001
        raise WorkloadError(f"workload {entry}: build() raised {_where(err)}") from None

    def bad(what: str):
        return WorkloadError(f"workload {entry}: {what}")

    if isinstance(built, Mapping):
        unknown = sorted(set(map(str, built)) - set(KEYS))
        if unknown:
            raise bad(f"build() returned unknown key(s) {', '.join(unknown)}; accepted: {', '.join(KEYS)}")
        get = built.get
    else:
        def get(key):
            return getattr(built, key, None)
    missing = [k for k in ("model", "batch", "loss") if get(k) is None]
    if missing:
        raise bad(f"build() returned no {', '.join(missing)} (a {type(built).__name__}); expected a mapping or "
                  "an object with model, batch and loss")
    model = get("model")
    if not isinstance(model, torch.nn.Module):
        raise bad(f"model is a {type(model).__name__}, expected a torch.nn.Module")
    if not any(True for _ in model.parameters()):
        raise bad(f"model {type(model).__name__} has no parameters: nothing to train")
    for key in ("batch", "loss", "optimizer"):
        if get(key) is not None and not callable(get(key)):
            raise bad(f"{key} is a {type(get(key)).__name__}, expected a callable")
    tokens = get("tokens_per_sample")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise bad(f"tokens_per_sample = {tokens!r}: expected a whole number >= 1")
    blocks = get("blocks")
    if blocks is None:
        blocks = [name for name, _ in model.named_children()]
    elif isinstance(blocks, str) or not all(isinstance(b, str) for b in blocks):
        raise bad(f"blocks = {blocks!r}: expected a list of submodule names, e.g. ['embed', 'layers.0', 'head']")
    blocks = tuple(blocks)
    for b in blocks:
        try:
            model.get_submodule(b)
        except AttributeError:
            raise bad(f"blocks names {b!r}, which is not a submodule of {type(model).__name__}") from None
    if len(set(blocks)) != len(blocks):
        raise bad(f"blocks = {list(blocks)}: a name appears twice")
    return Workload(entry, model, get("batch"), get("loss"), get("optimizer"), tokens, blocks, str(base_dir or "."))
