"""Length-bucketed batches for a PyTorch ``DataLoader``, single-process or distributed.

Sequence lengths in real corpora vary tens of times (pitfalls §4). A batch is padded to its longest
sequence, so a random batch of 16 that happens to hold one 3000-token document and fifteen 200-token
ones computes ~48k token positions for ~6k real tokens: most of the step is spent on padding (and
attention, quadratic in the padded length, wastes even more). Bucketing fixes it at the sampler:
sort the indices into length buckets, cut batches inside a bucket, shuffle the batches. Every batch
then holds sequences of similar length and the padding nearly disappears.

- ``LengthBucketSampler`` is a batch sampler built on ``preflight.models.padding.bucket_batches``::

      sampler = LengthBucketSampler(lengths, batch_size=16, seed=0)
      loader = DataLoader(ds, batch_sampler=sampler, collate_fn=pad_collate)
      for epoch in range(epochs):
          sampler.set_epoch(epoch)          # new, reproducible order each epoch
          for ids, mask in loader: ...

- ``pad_collate`` pads a list of token-id sequences to the longest one and returns the mask.

Distributed data parallel: every rank builds the same batch list (same seed, same epoch), then takes
its own disjoint share, the same number of batches on every rank (a rank with one batch fewer would
hang the others in the gradient all-reduce). The share is also *balanced per step*: batches are
grouped ``num_replicas`` at a time by cost (sequences x padded length) and step k gives one batch of
group k to each rank, so the ranks of one step work on batches of similar length. Random assignment
would pair a 4k-token batch on one rank with a 200-token batch on another, and the all-reduce waits
for the slowest one: the imbalance of §4, moved from padding to stragglers.
"""
from __future__ import annotations

import random

import torch
from torch.utils.data import Sampler

from preflight.models.padding import bucket_batches


def _default_world() -> tuple[int, int]:
    """(world size, rank) of the initialised default process group, else (1, 0)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class LengthBucketSampler(Sampler):
    """Yields lists of dataset indices, batches of similar sequence length.

    ``lengths[i]`` is the length (tokens) of sample i. ``n_buckets`` length buckets of nearly equal
    count (more buckets: tighter batches, less randomness in which samples meet; ``None``: one
    bucket per batch, fully sorted batching, the least padding). ``shuffle`` shuffles within buckets and
    the batch order, seeded by ``seed + epoch`` (call ``set_epoch`` every epoch, as with
    ``DistributedSampler``; every rank must pass the same seed).

    ``num_replicas`` / ``rank`` default to the initialised ``torch.distributed`` group (1 / 0
    without one). ``drop_last`` means two things, both "no irregular leftovers":

    - ``True``: incomplete batches are dropped (``bucket_batches``: at most one, in the bucket of the
      longest sequences), and when the number of batches
      does not divide by ``num_replicas`` the remainder is dropped too (with ``shuffle``, a random
      few batches each epoch; without it, the last ones). Every index at most once per epoch.
    - ``False`` (default): incomplete batches are kept, and the batch list is padded up to a multiple
      of ``num_replicas`` by repeating batches from its start, so a few samples are seen twice in
      that epoch (what ``DistributedSampler`` does). With one replica, every index exactly once.

    ``len(sampler)`` is the number of batches this rank yields per epoch.
    """

    def __init__(self, lengths, batch_size: int, n_buckets: int | None = 16, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, num_replicas: int | None = None,
                 rank: int | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        world, my_rank = _default_world()
        self.num_replicas = world if num_replicas is None else int(num_replicas)
        self.rank = my_rank if rank is None else int(rank)
        if self.num_replicas < 1 or not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"need 0 <= rank < num_replicas, got rank={self.rank}, "
                             f"num_replicas={self.num_replicas}")
        self.lengths = [int(n) for n in lengths]
        self.batch_size = int(batch_size)
        self.n_buckets = n_buckets
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Reseed with ``seed + epoch``: a different order each epoch, the same on every run."""
        self.epoch = int(epoch)

    def all_batches(self) -> list[list[int]]:
        """This epoch's batches for all ranks together (before the per-rank split)."""
        return bucket_batches(self.lengths, self.batch_size, n_buckets=self.n_buckets,
                              shuffle=self.shuffle, seed=self.seed + self.epoch, drop_last=self.drop_last)

    def rank_batches(self) -> list[list[int]]:
        """This epoch's batches for this rank, in the order it will see them."""
        batches = self.all_batches()
        world = self.num_replicas
        if world == 1:
            return batches
        # 1. equal count per rank: drop or pad the remainder.
        extra = len(batches) % world
        if extra and self.drop_last:
            batches = batches[:len(batches) - extra]
        elif extra and batches:
            batches = batches + [batches[i % len(batches)] for i in range(world - extra)]
        # 2. balanced steps: sort by cost, group world at a time, one batch of a group per rank.
        def cost(b):
            return len(b) * max((self.lengths[i] for i in b), default=0)

        order = sorted(range(len(batches)), key=lambda k: cost(batches[k]))
        groups = [order[k:k + world] for k in range(0, len(order), world)]
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(groups)
        return [batches[g[self.rank]] for g in groups]

    def __iter__(self):
        yield from self.rank_batches()

    def __len__(self) -> int:
        return len(self.rank_batches())


def pad_collate(batch, pad_id: int = 0, pad_to: int | None = None):
    """Pad token-id sequences to the longest in ``batch``; return ``(ids, attention_mask)``.

    ``batch`` is a list of 1-D sequences (lists or tensors of token ids). ``ids`` is a LongTensor
    ``[batch, longest]`` filled with ``pad_id`` after each sequence; ``attention_mask`` is a bool
    tensor of the same shape, True on real tokens. For ``nn.TransformerEncoder`` pass
    ``src_key_padding_mask=~attention_mask`` (there True means "ignore"). ``pad_to`` pads to a fixed
    length instead (at least the longest), as static-shape code or pad-to-the-dataset does.
    """
    seqs = [torch.as_tensor(s, dtype=torch.long).reshape(-1) for s in batch]
    longest = max((len(s) for s in seqs), default=0)
    width = longest if pad_to is None else max(int(pad_to), longest)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, s in enumerate(seqs):
        ids[row, :len(s)] = s
        mask[row, :len(s)] = True
    return ids, mask
