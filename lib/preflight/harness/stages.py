"""The two models chapter 4's pipelines split into stages, and the profile a partition is decided from.

- ``balanced_layers``: identical MLP blocks. Any even split gives equal stages, so the bubble formula
  ``(p-1) / (v*m + p-1)`` applies (``bench.pipeline``).
- ``hetero_layers``: an embedding, attention blocks, one wide FFN and an output head. Their costs
  really differ, so a split by *count* leaves one stage slower than the rest, and that stage sets the
  pace of every micro-batch slot (pitfalls §4). ``layer_times`` profiles each layer alone; the
  partition measurement (``bench.partition``) splits by those times and runs both splits.

A partition is given as the first layer index of each stage (``check_partition``), which places every
layer exactly once or refuses. Importing this module does not load torch.
"""
from __future__ import annotations

from itertools import pairwise

# sizes by quick (False / True); "mb" is the micro-batch: sequences (hetero), rows (balanced)
HETERO = {False: {"vocab": 8000, "d": 256, "seq": 64, "ffn": 2048, "mb": 2},
          True: {"vocab": 4000, "d": 128, "seq": 64, "ffn": 1024, "mb": 2}}
HETERO_NAMES = ["embedding", "attn1", "attn2", "wide_ffn", "attn3", "attn4", "head"]
BALANCED = {False: {"d": 256, "blocks": 8, "mb": 64}, True: {"d": 256, "blocks": 8, "mb": 32}}


def hetero_layers(quick: bool = False) -> list:
    """The heterogeneous model as ``[(name, module)]``: token ids (batch, seq) in, logits out."""
    from torch import nn

    s = HETERO[quick]

    def attn():
        return nn.TransformerEncoderLayer(s["d"], 4, dim_feedforward=2 * s["d"], dropout=0.0, batch_first=True)

    wide = nn.Sequential(nn.Linear(s["d"], s["ffn"]), nn.GELU(), nn.Linear(s["ffn"], s["d"]))
    modules = [nn.Embedding(s["vocab"], s["d"]), attn(), attn(), wide, attn(), attn(), nn.Linear(s["d"], s["vocab"])]
    return list(zip(HETERO_NAMES, modules, strict=True))


def balanced_layers(quick: bool = False) -> list:
    """Identical MLP blocks ``d -> 4d -> d``: the stages are equal whatever the even split."""
    from torch import nn

    d = BALANCED[quick]["d"]
    return [(f"mlp{i}", nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)))
            for i in range(BALANCED[quick]["blocks"])]


def stage_device(p: int):
    """Where ``p`` pipeline ranks run on this machine (``launch.init_distributed``'s rule): a GPU
    each when there are ``p`` GPUs, else the CPU (NCCL refuses two ranks on one GPU)."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return torch.device("cuda", 0) if gpus >= p else torch.device("cpu")


def layer_times(device="cpu", batch: int = 4, seq: int | None = None, quick: bool = False) -> list[dict]:
    """Forward+backward time of each layer of the heterogeneous model alone, on one thread (as a
    pipeline rank runs on the CPU): ``[{name, params, time_s}]``, the median after warm-up."""
    import torch

    from preflight.core.timing import time_fn

    torch.manual_seed(0)
    s, threads = HETERO[quick], torch.get_num_threads()
    x = torch.randint(0, s["vocab"], (batch, seq or s["seq"]), device=device)
    rows = []
    torch.set_num_threads(1)
    try:
        for name, layer in hetero_layers(quick):
            layer.to(device)
            inp = x.detach().requires_grad_() if x.is_floating_point() else x   # as in a stage: grads flow back
            out = layer(inp)
            grad = torch.ones_like(out)
            t = time_fn(lambda f=layer, i=inp, g=grad: f(i).backward(g), device=device, warmup=2, repeats=5,
                        min_time_s=0.05)
            rows.append({"name": name, "params": sum(q.numel() for q in layer.parameters()), "time_s": t.median_s})
            x = out.detach()
    finally:
        torch.set_num_threads(threads)
    return rows


def check_partition(boundaries, n_layers: int, n_stages: int) -> list[int]:
    """Stage ``i`` holds layers ``boundaries[i]`` up to the next boundary (the last: to the end). Every
    layer is placed exactly once iff there are ``n_stages`` strictly increasing indices, 0 first, all
    below ``n_layers``; anything else raises ValueError rather than silently dropping layers.

    From ``preflight.models.pipeline.partition_by_time(times, p)`` (stages as lists of layer indices):
    ``boundaries = [stage[0] for stage in parts]``."""
    b = [int(i) for i in boundaries]
    if len(b) != n_stages or b[0] != 0 or any(x >= y for x, y in pairwise(b)) or b[-1] >= n_layers:
        raise ValueError(f"partition {b}: need {n_stages} strictly increasing first-layer indices, "
                         f"0 first, all below {n_layers}")
    return b
