"""What a team takes into its own training loop: the fixes the chapters teach, as code with a promise.

Everything listed here is public: documented, tested, and kept (a change of name or meaning is said in
the changelog of a 0.x release). Everything else in ``preflight`` is the audit's own machinery and may
change without notice. The README's "Use it in your own training" runs them together in one loop.

Chapter 2, a starved data pipeline:
    ``convert(src, dst, shard_bytes)``   pack a small-file dataset into webdataset tar shards + manifest
    ``parse_size("64MB")``               a shard size as bytes
    ``shard_pipeline(dst, ...)``         checked, rank- and worker-split reading of those shards
    ``iter_shard(url, expected)``        one shard's samples; a truncated shard is an error, not a short epoch
    ``ShardError``                       what a bad source tree or shard raises, naming the file and sample
    ``LoaderMonitor(loader)``            data wait, queue depth and throughput of any DataLoader, left on
    ``timed(transform)``, ``stamped(collate_fn)``  the per-sample and per-batch tags it reads
Chapter 3, communication not overlapped:
    ``bf16_compress_hook``               DDP comm hook: bf16 gradients on any backend (gloo included)
Chapter 4, load imbalance:
    ``LengthBucketSampler(lengths, batch_size)``  batches of similar length, distributed-aware
    ``pad_collate(batch)``               (ids, attention_mask) padded to the batch's longest
Chapter 5, no fault tolerance:
    ``save(state, dir, step)``, ``load(folder)``, ``load_latest(*dirs)``, ``verify(folder)``
                                         durable checkpoints: fsync, atomic rename, sha256 manifest, ``latest``
                                         published last, fallback past a corrupt one, ``weights_only`` loading
    ``TwoStageCheckpointer(local, shared)``  snapshot in the loop, write local then shared in the background
    ``StopPoller(stop_file, rank, world)``   one stop decision on every rank, at < 0.1 % of a step
    ``poll_interval(check_s, step_s)``   how many steps apart it looks

Names are imported on first use (``preflight.toolkit.LoaderMonitor`` loads ``loadmon`` only), so
``import preflight.toolkit`` costs nothing and pulls in neither torch nor webdataset.
"""
from __future__ import annotations

import importlib

_WHERE = {
    "convert": "shards", "parse_size": "shards",
    "shard_pipeline": "shardread", "iter_shard": "shardread",
    "ShardError": "shardformat",
    "LoaderMonitor": "loadmon", "timed": "loadmon", "stamped": "loadmon",
    "bf16_compress_hook": "hooks",
    "LengthBucketSampler": "sampling", "pad_collate": "sampling",
    "save": "ckpt", "load": "ckpt", "load_latest": "ckpt", "verify": "ckpt", "TwoStageCheckpointer": "ckpt",
    "StopPoller": "stoppoll", "poll_interval": "stoppoll",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"preflight.toolkit has no {name!r}; its public names: {', '.join(__all__)}")
    value = getattr(importlib.import_module(f"preflight.toolkit.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
