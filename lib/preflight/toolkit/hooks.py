"""DDP communication hooks that halve the gradient bytes, on any backend.

DistributedDataParallel all-reduces gradients bucket by bucket during backward. A *communication
hook* replaces that all-reduce: it receives a ``GradBucket`` (one flat buffer holding several
parameters' gradients) and returns a ``torch.futures.Future`` of the averaged buffer. Casting the
bucket to a 16-bit type before the all-reduce halves the bytes on the wire (pitfalls brief, section 3);
the sum is then done in 16 bits, so the averaged gradient carries 16-bit rounding::

    ddp.register_comm_hook(None, bf16_compress_hook)    # None: the default (world) process group

- ``fp16_compress_hook``: torch's own (``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``),
  re-exported; it works on every backend, gloo included. FP16 has 10 mantissa bits but a narrow range:
  tiny gradients underflow to zero unless the loss is scaled (``torch.amp.GradScaler``).
- ``bf16_compress_hook``: the same cast to bfloat16 (8 mantissa bits, fp32's range: no loss scaling).
  torch's own ``bf16_compress_hook`` is refused by ``DDP.register_comm_hook`` unless torch was *built*
  with CUDA (or ROCm) and NCCL 2.10+ (or runs on XPU with XCCL). The check goes by the hook's *name* and
  the build, not by what the process group can do: a CPU-only torch refuses it although gloo
  all-reduces bfloat16 tensors fine (and a CUDA build accepts it even on gloo). This one does the same
  arithmetic under another ``__name__``, so it runs on every build and backend.

Expect the averaged gradients to differ from an fp32 all-reduce by about one bf16 rounding
(relative 2**-8 = 0.4 %), and training curves to differ a little, not to diverge.
"""
from __future__ import annotations

from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

__all__ = ["bf16_compress_hook", "fp16_compress_hook"]


def bf16_compress_hook(process_group, bucket):
    """Average ``bucket`` across ``process_group`` (None: the world) in bfloat16, on any backend.

    1. cast the bucket's flat buffer to bfloat16 and divide by the world size first (the sum of
       pre-divided values cannot overflow);
    2. all-reduce (sum) asynchronously: DDP carries on with backward while the bytes travel;
    3. when the all-reduce completes, cast back into the bucket's own buffer (its dtype, in place: no
       second full-size copy) and return it as the future's value.
    """
    import torch
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size(group))
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(done):
        buffer.copy_(done.value()[0])
        return buffer

    return fut.then(decompress)


# DDP refuses any hook named "bf16_compress_hook" on a torch built without NCCL (see the module docstring).
bf16_compress_hook.__name__ = bf16_compress_hook.__qualname__ = "bf16_compress_hook_any_backend"
