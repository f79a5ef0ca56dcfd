"""The GPT that the memory planner's formulas describe exactly: a Megatron layer, written out, and
its current variants (flash attention, SwiGLU, grouped-query attention, no dropout).

``preflight.bench.memory`` checks the planner (``preflight.models.memory``) by counting what a real
model holds. That check only means something if the model is the one the formulas were derived
for: Korthikanti et al. 2022 (Table 2) count ``sbh (34 + 5 a s / h)`` bytes of activations per
layer (s sequence, b micro-batch, h hidden, a heads) for a Megatron GPT layer in 16-bit with 1-byte
dropout masks. This module is that layer and nothing more, built from plain ``torch.nn`` parts.

What one ``Layer`` saves for backward, in the paper's units (each a byte count: "2 sbh" is a 16-bit
s x b x h tensor)::

    LayerNorm 1 input                     2 sbh      LayerNorm 2 input              2 sbh
    QKV Linear input (LN output)          2 sbh      fc1 input (LN output)           2 sbh
    q, k  (contiguous copies for Q K^T)   4 sbh      GELU input (fc1 output)         8 sbh
    softmax output                        2 a s^2 b  fc2 input (GELU output)         8 sbh
    its dropout mask (bool)               1 a s^2 b  dropout mask (bool)             1 sbh
    dropped probabilities (for P V)       2 a s^2 b                                ------
    v  (contiguous copy for P V)          2 sbh      MLP                            19 sbh
    output projection input               2 sbh
    dropout mask (bool)                   1 sbh      attention 11 sbh + 5 a s^2 b
                                                     layer     34 sbh + 5 a s^2 b

plus what the paper does not count: LayerNorm's mean and rstd, ``s b`` values each, two per
LayerNorm, four per layer (bf16 on the CPU, fp32 on CUDA).

The variants (``MemConfig`` fields; ``variants(cfg)`` builds the four the live check runs), each
what ``preflight.models.activations`` counts for it:

- ``attention="flash"``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, which on the
  CPU (bf16 or fp32) and on CUDA (bf16) runs a flash kernel: it saves q, k, v (views of the QKV
  output: its storage, once), its output (whose storage the projection's input is a view of) and
  the fp32 logsumexp, a s b values. No attention dropout inside it: the CPU flash kernel has none
  (with ``dropout_p > 0`` SDPA falls back to the math path, in fp32); on CUDA the kernel would
  regenerate the mask from a Philox seed and offset, a few bytes.
- ``kv_heads < heads`` (GQA): the QKV projection makes ``heads + 2 kv_heads`` heads. Flash takes
  them as they are (``enable_gqa``); the math path expands k and v to all heads first
  (``expand`` + ``reshape``, as Hugging Face's ``repeat_kv``), and saves the expanded copies.
- ``mlp="swiglu"``: one fused gate/up projection ``h -> 2 ffn``, ``silu(gate) * up``, ``ffn -> h``:
  SiLU saves gate (a view: the projection's whole output, 2 tensors), the product saves silu(gate)
  and up (same storage), the down projection its input: 4 tensors of s b ffn.
- ``dropout=0``: no ``native_dropout`` at all, so no masks.

Why each piece is written the way it is; each is a place where a real model can differ from the
formula, and would make the check fail for a reason that is not the planner's:

- **Explicit attention** (``softmax(q k^T / sqrt(d)) v`` in ``core_attention``), not
  ``F.scaled_dot_product_attention``. The fused kernels (flash, memory-efficient, CPU flash) never
  store the s^2 scores: that is the planner's "selective" case, not the 5 a s^2 b the paper counts.
- **A ``-inf`` causal bias, added.** An add saves nothing for backward, whereas
  ``masked_fill(mask, -inf)`` would save the bool s^2 mask (s^2 bytes, shared by all layers). The
  bias is a non-persistent buffer, so it is model state, never counted as an activation.
- **``torch.native_dropout``** (``dropout`` below), which keeps a 1-byte bool mask on every device.
  ``nn.Dropout`` / ``F.dropout`` dispatch to it only on CUDA (and XPU, lazy, privateuse1); on the
  CPU they multiply by a noise tensor *of the input's dtype*, 2 bytes per element in bf16, so each
  mask would cost twice the paper's figure there (+2 sbh + a s^2 b per layer).
- **q, k, v as views of the QKV output.** ``torch.matmul`` copies the transposed heads into
  contiguous q, k, v (2 sbh each) and saves those; Megatron's ``baddbmm`` on views saves the QKV
  output itself (6 sbh): the same bytes either way.
- **fp32 logits for the loss** (``logits.float()``), so ``log_softmax`` saves fp32 logits: the
  planner's 4 s b V output term.
- **Recompute switches** (``GPT.set_recompute``). ``"selective"`` checkpoints ``core_attention``
  with ``torch.utils.checkpoint`` (the s^2 part is recomputed; its QKV input, 6 sbh, stays),
  ``"full"`` checkpoints each whole layer (only its 2 sbh input stays). The checkpoint is taken
  *inside* ``Layer.forward`` so that forward hooks on the layer still see the region.

Sizes: ``MemConfig`` and its presets (``CPU_QUICK``, ``CPU_NORMAL``, ``GPU_QUICK``, ``GPU_NORMAL``,
chosen by ``config_for(device, quick)``); ``make_model`` and ``make_batch`` are seeded, so two calls
build the same weights and tokens.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import torch
from torch import nn
from torch.nn import functional as F


# ------------------------------------------------------------------------------------------ sizes
@dataclass(frozen=True)
class MemConfig:
    layers: int
    hidden: int
    heads: int
    seq_len: int
    batch: int          # micro-batch size b
    vocab: int
    dropout: float = 0.1
    attention: str = "math"           # the paper's explicit attention; "flash" = SDPA's fused kernel
    mlp: str = "gelu"                 # or "swiglu"
    ffn: int | None = None            # MLP hidden size; None = 4 hidden
    kv_heads: int | None = None       # None = heads (multi-head attention)

    @property
    def ffn_hidden(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def n_kv(self) -> int:
        return self.kv_heads or self.heads

    def as_dict(self) -> dict:
        return asdict(self)


# CPU: a quick run is ~1-2 s on 2 cores, the normal one a few seconds. GPU: large enough that the
# activations dominate the peak (h=1024, s=1024: ~0.4 GB per layer in fp32), small for an H100.
MODES = ("none", "selective", "full")        # the recompute modes this reference model implements
CPU_QUICK = MemConfig(layers=2, hidden=256, heads=8, seq_len=256, batch=2, vocab=1000)
CPU_NORMAL = MemConfig(layers=4, hidden=512, heads=8, seq_len=512, batch=2, vocab=4096)
GPU_QUICK = MemConfig(layers=2, hidden=512, heads=8, seq_len=512, batch=2, vocab=8192)
GPU_NORMAL = MemConfig(layers=4, hidden=1024, heads=16, seq_len=1024, batch=2, vocab=32000)


def config_for(device, quick: bool = False) -> MemConfig:
    gpu = torch.device(device).type == "cuda"
    return (GPU_QUICK if quick else GPU_NORMAL) if gpu else (CPU_QUICK if quick else CPU_NORMAL)


def variants(cfg: MemConfig) -> dict[str, MemConfig]:
    """The four layers the live check measures at ``cfg``'s size: GPT-style (GELU 4h, all heads, dropout)
    with math and with flash attention; Llama-style (SwiGLU of 8h/3 rounded up to 64, a quarter of
    the heads for K and V, no dropout) with flash and with math attention."""
    llama = replace(cfg, mlp="swiglu", ffn=64 * math.ceil(8 * cfg.hidden / 3 / 64),
                    kv_heads=max(1, cfg.heads // 4), dropout=0.0)
    return {"gpt_math": replace(cfg, attention="math"), "gpt_flash": replace(cfg, attention="flash"),
            "llama_flash": replace(llama, attention="flash"), "llama_math": replace(llama, attention="math")}


# ------------------------------------------------------------------------------------------ model
def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout that keeps a 1-byte bool mask on every device (``torch.native_dropout``, what
    ``F.dropout`` uses on CUDA; on the CPU ``F.dropout`` would keep a mask of ``x``'s dtype)."""
    if not training or p == 0:
        return x
    return torch.native_dropout(x, p, True)[0]


def core_attention(q, k, v, bias, p: float, training: bool):
    """softmax(q k^T / sqrt(d) + causal bias), dropout, times v: the s^2 part of a layer, explicit
    so that the scores are stored (what the formula's 5 a s^2 b counts). K and V with fewer heads
    (GQA) are expanded to Q's heads first, as unfused implementations do."""
    b, a, s, d = q.shape
    if k.shape[1] != a:
        k, v = (t[:, :, None].expand(b, t.shape[1], a // t.shape[1], s, d).reshape(b, a, s, d) for t in (k, v))
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d)) + bias
    probs = torch.softmax(scores, dim=-1)
    return dropout(probs, p, training) @ v


def flash_attention(q, k, v, bias, p: float, training: bool):
    """The fused kernel (same signature as ``core_attention``; the causal mask is built in, and
    there is no attention dropout: see the module docstring)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])


class Layer(nn.Module):
    """One Megatron GPT layer (pre-norm): LN, QKV, attention, projection, dropout, residual; LN,
    h -> 4h, GELU, 4h -> h, dropout, residual (or the variants of ``MemConfig``)."""

    def __init__(self, cfg: MemConfig):
        super().__init__()
        h, f, d = cfg.hidden, cfg.ffn_hidden, cfg.hidden // cfg.heads
        self.heads, self.kv, self.p, self.swiglu = cfg.heads, cfg.n_kv, cfg.dropout, cfg.mlp == "swiglu"
        self.attend = flash_attention if cfg.attention == "flash" else core_attention
        self.recompute = "none"
        self.ln1, self.qkv, self.proj = nn.LayerNorm(h), nn.Linear(h, (cfg.heads + 2 * cfg.n_kv) * d), nn.Linear(h, h)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(h), nn.Linear(h, (2 if self.swiglu else 1) * f), nn.Linear(f, h)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        if self.recompute == "full":     # checkpoint inside the module: its hooks see the checkpoint
            from torch.utils.checkpoint import checkpoint

            return checkpoint(self._forward, x, bias, use_reentrant=False)
        return self._forward(x, bias)

    def _forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, self.heads + 2 * self.kv, h // self.heads).transpose(1, 2)
        q, k, v = qkv.split([self.heads, self.kv, self.kv], dim=1)
        if self.recompute == "selective":
            from torch.utils.checkpoint import checkpoint

            ctx = checkpoint(self.attend, q, k, v, bias, self.p, self.training, use_reentrant=False)
        else:
            ctx = self.attend(q, k, v, bias, self.p, self.training)
        x = x + dropout(self.proj(ctx.transpose(1, 2).reshape(b, s, h)), self.p, self.training)
        up = self.fc1(self.ln2(x))
        if self.swiglu:
            gate, up = up.chunk(2, dim=-1)
            act = F.silu(gate) * up
        else:
            act = F.gelu(up)
        return x + dropout(self.fc2(act), self.p, self.training)


class GPT(nn.Module):
    """Token embedding + dropout, ``layers`` x ``Layer``, final LayerNorm, untied output head;
    ``forward(idx, targets)`` returns the mean cross-entropy computed in fp32."""

    def __init__(self, cfg: MemConfig):
        super().__init__()
        self.cfg = cfg
        self.emb = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        mask = torch.full((cfg.seq_len, cfg.seq_len), float("-inf")).triu(1)
        self.register_buffer("causal_bias", mask, persistent=False)

    def set_recompute(self, mode: str) -> GPT:
        """Switch every layer to ``mode`` (one of ``preflight.models.memory.RECOMPUTE``); returns self."""
        if mode not in MODES:
            raise ValueError(f"recompute must be one of {MODES} (got {mode!r})")
        for layer in self.layers:
            layer.recompute = mode
        return self

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        s = idx.shape[1]
        bias = self.causal_bias[:s, :s]
        x = dropout(self.emb(idx), self.cfg.dropout, self.training)
        for layer in self.layers:
            x = layer(x, bias)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def make_model(cfg: MemConfig, device, dtype=torch.float32, seed: int = 0) -> GPT:
    """A seeded ``GPT(cfg)`` on ``device`` in ``dtype``, in training mode (dropout on)."""
    torch.manual_seed(seed)
    return GPT(cfg).to(device=device, dtype=dtype).train()


def make_batch(cfg: MemConfig, device, seed: int = 1):
    """Seeded ``(tokens, targets)``, each ``batch x seq_len`` int64, targets shifted by one."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq_len + 1), generator=g)
    return t[:, :-1].contiguous().to(device), t[:, 1:].contiguous().to(device)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
