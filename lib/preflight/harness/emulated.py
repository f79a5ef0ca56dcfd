"""The emulated device: layers whose compute is a timed wait, so an accelerator's overlap shows on a CPU.

On a GPU, a kernel launch returns at once and the host thread is free while the device computes;
that is what lets DDP's communication thread all-reduce one bucket while backward runs on the next.
On a CPU backward keeps the core busy, and gloo's thread waits for it: overlap cannot show there
(field notes). An emulated layer sleeps for its forward and backward time instead (``time.sleep``
releases the GIL and the core, as a kernel frees the host) and returns real gradient tensors of its
parameters' shapes, so DDP buckets and all-reduces real bytes on a real process group, with only the
compute replaced by its duration. Record and chapter call such runs "EMULATED device".

The one home of the emulation: chapter 3's reference stack (``bench.overlap``) and a team's own
model's blocks (``bench.workload_overlap``) both build their layers here.
"""
from __future__ import annotations

import time


def emulated_block(params, fwd_s: float, bwd_s: float, log: list | None = None):
    """An emulated-device layer: a module holding copies of ``params`` (same shapes, same values)
    whose forward and backward are waits of ``fwd_s`` / ``bwd_s`` seconds (``time.sleep``: the GIL
    released and the core free, as a GPU kernel frees the host) and whose gradients are fills of
    1e-3, so DDP buckets and all-reduces real tensors of the real shapes. The input passes through.
    With ``log``, each backward appends its end (``perf_counter``)."""
    import torch
    from torch import nn

    class Wait(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, *weights):
            ctx.specs = [(w.shape, w.dtype) for w in weights]
            time.sleep(fwd_s)
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            time.sleep(bwd_s)
            if log is not None:
                log.append(time.perf_counter())
            return (grad, *(torch.full(shape, 1e-3, dtype=dtype, device=grad.device) for shape, dtype in ctx.specs))

    class EmulatedBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = nn.ParameterList([nn.Parameter(p.detach().clone()) for p in params])

        def forward(self, x):
            return Wait.apply(x, *self.weights)

    return EmulatedBlock()
