"""The models the live measurements train, in one place (torch at the top: the bench modules import
this one inside the functions that measure, so importing them does not load torch).

- ``RefModel`` (``make_model``), the reference model: a small decoder-only Transformer built from
  plain ``torch.nn`` parts so that its op mix is that of a real LLM block: LayerNorm, attention
  (``scaled_dot_product_attention``), a GELU MLP four times wider than the model, residual adds, a
  tied-free output head. ``config_for(device)`` sizes it to the machine: small enough on a 2-core
  CPU that a measurement takes seconds, large enough on a GPU to fill it. ``SyntheticTokens`` feeds it.
- ``MemoryBoundBlock``: chapter 1's fusion measurement (``bench.fusion``).
- ``TinyLM``: chapter 4's padding measurement (``bench.padding``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class RefConfig:
    vocab: int = 4096
    layers: int = 2
    hidden: int = 256
    heads: int = 4
    seq_len: int = 128
    batch: int = 8
    dtype: str = "fp32"      # compute dtype: fp32 on CPU, bf16 autocast on GPU

    def as_dict(self) -> dict:
        return asdict(self)


# Sizes by device: (CPU) seconds per measurement on 2 cores; (GPU) ~1.3B-class block stack that
# keeps an H100/H200 busy (tens of ms per step) without memory trouble.
CPU_CONFIG = RefConfig()
CPU_TINY = RefConfig(vocab=512, layers=1, hidden=64, heads=2, seq_len=32, batch=4)  # tests
GPU_CONFIG = RefConfig(vocab=32768, layers=8, hidden=2048, heads=16, seq_len=2048, batch=8, dtype="bf16")


class SyntheticTokens(torch.utils.data.Dataset):
    """Random token sequences, generated per item from a per-index seed (deterministic, and real CPU
    work for the loader: the data wait the loop measures is not zero by construction)."""

    def __init__(self, cfg: RefConfig, length: int = 1_000_000, seed: int = 0):
        self.cfg, self.length, self.seed = cfg, length, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(self.seed + i)
        t = torch.randint(0, self.cfg.vocab, (self.cfg.seq_len + 1,), generator=g)
        return t[:-1], t[1:]


def config_for(device, tiny: bool = False) -> RefConfig:
    if tiny:
        return CPU_TINY
    return GPU_CONFIG if torch.device(device).type == "cuda" else CPU_CONFIG


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class RefModel(nn.Module):
    def __init__(self, cfg: RefConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg.hidden, cfg.heads) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def count_params(model: nn.Module, exclude_embeddings: bool = False) -> int:
    """Parameter count; ``exclude_embeddings`` drops the token and position tables (the strict
    convention for the 6N FLOPs rule, whose embedding lookup does no matmul)."""
    skip = set()
    if exclude_embeddings and isinstance(model, RefModel):
        skip = {id(model.embed.weight), id(model.pos.weight)}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def make_model(cfg: RefConfig, device="cpu", seed: int = 0) -> RefModel:
    torch.manual_seed(seed)
    return RefModel(cfg).to(device)


def synthetic_batch(cfg: RefConfig, device="cpu", generator: torch.Generator | None = None):
    """Random tokens and next-token targets of shape (batch, seq_len)."""
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq_len + 1), generator=generator)
    tokens = tokens.to(device, non_blocking=True)
    return tokens[:, :-1], tokens[:, 1:]


def autocast(cfg: RefConfig, device):
    """bf16 autocast on GPU configs, a no-op context on fp32."""
    dev = torch.device(device)
    enabled = cfg.dtype == "bf16"
    return torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=enabled)


class MemoryBoundBlock(nn.Module):
    """``LayerNorm(x + GELU(Linear(x)))``: one matmul, then three memory-bound ops; the block chapter 1's
    fusion measurement (``bench.fusion``) runs eager and compiled."""

    def __init__(self, hidden: int):
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + F.gelu(self.fc(x)))


class TinyLM(nn.Module):
    """Embedding -> ``layers`` Transformer encoder layers (batch_first) -> token head: the model
    chapter 4's padding measurement (``bench.padding``) trains on padded and on bucketed batches."""

    def __init__(self, d_model: int, layers: int, vocab: int, max_len: int = 4096):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead=max(1, d_model // 32),
                                           dim_feedforward=4 * d_model, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.embed(ids) + self.pos(pos)
        return self.head(self.encoder(x, src_key_padding_mask=~mask))
