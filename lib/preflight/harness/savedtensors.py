"""What autograd keeps for the backward pass, counted exactly.

Activation memory is the bytes of the tensors the forward pass *saves* for backward (inputs of
matmuls, dropout masks, softmax outputs...). ``torch.autograd.graph.saved_tensors_hooks`` sees each
one as it is saved. Counting them right takes two rules:

- **once per storage**: a view saved by two ops, or a slice of a larger buffer, keeps the whole
  underlying storage alive, once. So the key is ``untyped_storage().data_ptr()`` and the size is the
  storage's ``nbytes()``, not the view's;
- **model state excluded**: parameters and buffers are saved too (a matmul saves its weight), but they
  are weights, not activations. Under bf16 autocast the *bf16 copies* of the weights are new storages
  and do count: they live until backward.

Used by ``preflight.bench.baseline`` (bytes behind the CPU peak-memory estimate) and
``preflight.bench.memory`` (the planner's per-layer activations, checked to the byte).

    with SavedTensors(exclude=model) as saved:
        loss = model(x, y)
    saved.total_bytes                      # bytes autograd holds for this forward
    names = saver_ops(loss)                # storage -> which ops saved it
"""
from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:      # torch is imported where it runs: importing this module does not load it
    import torch


class SavedTensors:
    """Context manager: every storage saved for backward inside it, once, model state excluded.

    ``exclude``: a module (its parameters and buffers) or tensors not to count. Set ``part`` while
    the forward runs (from forward hooks) to attribute each storage to the part that saved it first.
    ``storages`` maps storage pointer -> {"part", "bytes", "shape", "dtype"} of the first save."""

    def __init__(self, exclude: torch.nn.Module | list[torch.Tensor] = ()):
        import torch

        tensors = [*exclude.parameters(), *exclude.buffers()] if isinstance(exclude, torch.nn.Module) else exclude
        self.excluded = {t.untyped_storage().data_ptr() for t in tensors}
        self.storages: dict[int, dict] = {}
        self.part = ""
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if st.nbytes() and ptr not in self.excluded and ptr not in self.storages:
            self.storages[ptr] = {"part": self.part, "bytes": int(st.nbytes()), "shape": list(t.shape),
                                  "dtype": str(t.dtype).removeprefix("torch.")}
        return t

    def __enter__(self) -> SavedTensors:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    @property
    def total_bytes(self) -> int:
        return sum(r["bytes"] for r in self.storages.values())


def saver_ops(loss: torch.Tensor) -> dict[int, set[str]]:
    """Walk the autograd graph from ``loss``: storage pointer -> names of the nodes that saved it
    (``NativeLayerNormBackward0.input``...). Do not call it on a checkpointed model: reading a saved
    tensor inside a checkpointed region runs the region's recomputation, once per read."""
    import torch

    out: dict[int, set[str]] = defaultdict(set)
    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        name = node.name()
        vals = []
        for attr in dir(node):
            if attr.startswith("_saved_"):
                try:
                    vals.append((attr[7:], getattr(node, attr)))
                except Exception:  # noqa: BLE001 - an attribute that cannot be read back
                    continue
        try:
            vals.extend(("saved_tensors", t) for t in (getattr(node, "saved_tensors", None) or ()))
        except Exception:  # noqa: BLE001 - custom Function without readable saved tensors
            pass
        for attr, val in vals:
            for t in (val if isinstance(val, (list, tuple)) else (val,)):
                if torch.is_tensor(t) and t.untyped_storage().nbytes():
                    out[t.untyped_storage().data_ptr()].add(f"{name}.{attr}")
        todo.extend(fn for fn, _ in node.next_functions)
    return out
