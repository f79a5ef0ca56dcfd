"""Padding waste, measured: useful tokens per second of three ways to batch the same sequences.

A small real Transformer (``nn.TransformerEncoder`` with a key padding mask, an embedding and a
token head) trains forward + backward + SGD step over one epoch of the same lengths (log-normal,
the shape of real corpora), batched three ways:

- ``pad_dataset``: random batches, every sequence padded to the longest in the *dataset* (static
  shapes, the simplest loader);
- ``pad_batch``:   random batches, padded to the longest in the *batch* (``pad_collate``);
- ``bucketing``:   batches of similar length from ``LengthBucketSampler``, padded to the batch's
  longest.

Per strategy: real tokens (the same for all three), padded tokens (padding positions), processed
tokens (real + padded: what the model computes), waste = padded / processed (the same counts as the
pure model ``preflight.models.padding.padding_table``), the epoch's wall time, and *useful*
tokens/s = real tokens / time, the only throughput that matters (processed tokens/s flatters
``pad_dataset``: big uniform matmuls run fast, on padding). The padding mask keeps the result correct, it does not skip the
work: the padded positions still go through every matmul, and attention is quadratic in the padded
length, so the time lost is larger than the token waste. ``bucketing_speedup`` = useful tokens/s of
bucketing / of ``pad_batch``; ``bucketing_speedup_vs_dataset`` the same against ``pad_dataset``.

Timing: the padded batches are built before the clock starts (this measures the model, not the
loader), each strategy gets a fresh model with the same seed, warm-up steps on its longest batch,
then ``repeats`` timed epochs, taken round-robin across strategies so a change in machine load hits
all three alike; the median epoch is reported. Lengths are scaled to the device: on a GPU the
corpus-like median 512 / max 4096; on a CPU median 32 / max 256, so that the slowest strategy
(512 sequences padded to 256) takes a few seconds on 2 cores; a 4096-token pad would take minutes.

CLI: ``python -m preflight.bench.padding --out DIR [--quick]`` writes one record (method "padding").
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from preflight.core.records import Method
from preflight.core.timing import synchronize, time_fn

METHOD = Method("padding", 1, required=("rows", "config"))
STRATEGIES = ("pad_dataset", "pad_batch", "bucketing")
STRATEGY_LABELS = {"pad_dataset": "pad to the longest in the dataset", "pad_batch": "pad to the longest in each batch",
                   "bucketing": "length bucketing"}          # how a page names them
VOCAB = 256

# Log-normal length distributions (median, sigma, max_len) per device kind.
GPU_LENGTHS = {"median": 512, "sigma": 0.8, "max_len": 4096}
CPU_LENGTHS = {"median": 32, "sigma": 0.8, "max_len": 256}


def random_batches(n: int, batch: int, seed: int = 0) -> list[list[int]]:
    """Indices 0..n-1 shuffled and cut into batches of ``batch`` (last one may be short); the same
    batches as ``preflight.models.padding.pad_to_longest_in_batch`` with ``shuffle_seed=seed``."""
    perm = np.random.default_rng(seed).permutation(n).tolist()
    return [perm[k:k + batch] for k in range(0, n, batch)]


def default_buckets(n: int, batch: int) -> int:
    """Up to 16 length buckets, each at least two batches deep (fewer, wider buckets for small n)."""
    return max(1, min(16, n // (2 * batch)))


def strategy_batches(lengths: list[int], batch: int, n_buckets: int,
                     seed: int = 0) -> dict[str, tuple[list, int | None]]:
    """For each strategy: (batches of indices, fixed padded length or None for the batch's longest)."""
    from preflight.toolkit.sampling import LengthBucketSampler

    rand = random_batches(len(lengths), batch, seed)
    bucketed = list(LengthBucketSampler(lengths, batch, n_buckets=n_buckets, shuffle=True, seed=seed))
    return {"pad_dataset": (rand, max(lengths)), "pad_batch": (rand, None), "bucketing": (bucketed, None)}


def _lengths_for(device, n: int, seed: int = 0) -> tuple[list[int], dict]:
    import torch

    from preflight.models.padding import lognormal_lengths

    spec = dict(GPU_LENGTHS if torch.device(device).type == "cuda" else CPU_LENGTHS)
    return [int(x) for x in lognormal_lengths(n, seed=seed, **spec)], spec


def measure_padding(device=None, lengths=None, n: int | None = None, batch: int = 16, d_model: int = 128,
                    layers: int = 2, quick: bool = False, repeats: int | None = None,
                    n_buckets: int | None = None, warmup_steps: int = 2, seed: int = 0) -> dict:
    """Measure the three batching strategies on ``device``; JSON-able dict.

    ``lengths`` (token counts, one per sample) defaults to ``n`` log-normal lengths (``n`` = 512, 128
    when ``quick``) sized for the device (module docstring). ``repeats`` timed epochs per strategy
    (default 1 on a CPU, 3 on a GPU); ``n_buckets`` defaults to ``default_buckets``.

    Keys: ``rows`` (one per strategy: ``strategy``, ``batches``, ``real_tokens``, ``padded_tokens``,
    ``processed_tokens``, ``waste``, ``epoch_s``, ``epoch_s_samples``, ``useful_tokens_per_s``,
    ``processed_tokens_per_s``), ``bucketing_speedup`` (vs ``pad_batch``),
    ``bucketing_speedup_vs_dataset``, ``pad_batch_speedup_vs_dataset``, ``config``, ``device``,
    ``notes`` (a warning when the machine was already busy).
    """
    import torch
    from torch import nn

    from preflight.core.device import default_device
    from preflight.core.timing import busy_warning
    from preflight.harness.reference import TinyLM
    from preflight.toolkit.sampling import pad_collate

    busy = busy_warning()
    device = torch.device(device) if device is not None else default_device()
    length_spec = None
    if lengths is None:
        lengths, length_spec = _lengths_for(device, n or (128 if quick else 512), seed)
    lengths = [int(x) for x in lengths]
    if repeats is None:
        repeats = 3 if device.type == "cuda" else 1

    gen = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(1, VOCAB, (max(1, L),), generator=gen) for L in lengths]
    n_buckets = n_buckets or default_buckets(len(lengths), batch)
    plans = strategy_batches(lengths, batch, n_buckets, seed)
    # Pre-built padded batches, on the device: the clock sees the model only.
    data = {s: [tuple(t.to(device) for t in pad_collate([seqs[i] for i in b], pad_to=pad_to)) for b in bs]
            for s, (bs, pad_to) in plans.items()}

    epochs = {}
    for s in STRATEGIES:
        torch.manual_seed(seed)
        model = TinyLM(d_model, layers, vocab=VOCAB, max_len=max(lengths) + 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step(ids, mask, model=model, opt=opt):
            opt.zero_grad(set_to_none=True)
            logits = model(ids, mask)
            loss = nn.functional.cross_entropy(logits[mask], ids[mask])   # real tokens only
            loss.backward()
            opt.step()

        def epoch(step=step, batches=data[s]):
            for ids, mask in batches:
                step(ids, mask)

        longest = max(data[s], key=lambda t: t[0].numel())   # warm-up on the largest shape
        for _ in range(warmup_steps):
            step(*longest)
        synchronize(device)
        epochs[s] = epoch

    samples = {s: [] for s in STRATEGIES}
    for _ in range(repeats):            # round-robin: load drift hits every strategy alike
        for s in STRATEGIES:
            samples[s].append(time_fn(epochs[s], device=device, warmup=0, repeats=1).median_s)

    rows = []
    for s in STRATEGIES:
        real = sum(int(m.sum()) for _, m in data[s])
        processed = sum(m.numel() for _, m in data[s])
        t = statistics.median(samples[s])
        rows.append({"strategy": s, "batches": len(data[s]), "real_tokens": real,
                     "padded_tokens": processed - real, "processed_tokens": processed,
                     "waste": (processed - real) / processed, "epoch_s": t, "epoch_s_samples": samples[s],
                     "useful_tokens_per_s": real / t, "processed_tokens_per_s": processed / t})
    tps = {r["strategy"]: r["useful_tokens_per_s"] for r in rows}
    return {
        "device": str(device),
        "rows": rows,
        "bucketing_speedup": tps["bucketing"] / tps["pad_batch"],
        "bucketing_speedup_vs_dataset": tps["bucketing"] / tps["pad_dataset"],
        "pad_batch_speedup_vs_dataset": tps["pad_batch"] / tps["pad_dataset"],
        "notes": [busy] if busy else [],
        "config": {"n": len(lengths), "batch": batch, "n_buckets": n_buckets, "d_model": d_model, "layers": layers,
                   "quick": quick, "repeats": repeats, "warmup_steps": warmup_steps, "seed": seed, "vocab": VOCAB,
                   "lengths": length_spec, "median_len": statistics.median(lengths),
                   "mean_len": statistics.fmean(lengths), "max_len": max(lengths)},
    }


def format_table(res: dict) -> str:
    """The rows as a fixed-width text table."""
    lines = [f"{'strategy':<12} {'waste':>6} {'epoch s':>8} {'useful tok/s':>13} {'processed tok/s':>16}"]
    for r in res["rows"]:
        lines.append(f"{r['strategy']:<12} {r['waste']:>6.1%} {r['epoch_s']:>8.3f} "
                     f"{r['useful_tokens_per_s']:>13,.0f} {r['processed_tokens_per_s']:>16,.0f}")
    lines.append(f"bucketing speedup: {res['bucketing_speedup']:.2f}x vs pad_batch, "
                 f"{res['bucketing_speedup_vs_dataset']:.2f}x vs pad_dataset")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from preflight.core.device import probe
    from preflight.core.records import save_record

    ap = argparse.ArgumentParser(prog="python -m preflight.bench.padding", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="results folder for the record")
    ap.add_argument("--quick", action="store_true", help="small sizes (tests, smoke runs)")
    args = ap.parse_args(argv)
    res = measure_padding(quick=args.quick)
    rec = METHOD.record({"quick": args.quick, "config": res["config"]}, res,
                      device=probe().as_dict())
    path = save_record(rec, args.out)
    print(format_table(res))
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
