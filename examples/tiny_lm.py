"""A workload for ``python -m preflight audit examples/tiny_lm.yaml``: a small decoder-only LM.

Built from ``torch.nn`` only: token + position embeddings, pre-norm Transformer layers with a causal
mask (``nn.TransformerEncoderLayer``, GELU, dropout 0.1), a final LayerNorm and an output head. The
batch is random tokens with next-token targets, from the workload's own seeded generator (a stream
that a resume replays to its position). The blocks run in sequence, so chapter 4 can cut the model
into pipeline stages anywhere between them.
"""
import torch
from torch import nn
from torch.nn import functional as F

VOCAB, D, HEADS, LAYERS, SEQ, BATCH = 256, 64, 4, 4, 32, 8


class Embedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, D)
        self.positions = nn.Embedding(SEQ, D)

    def forward(self, tokens):
        return self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))


class CausalLayer(nn.TransformerEncoderLayer):
    """A decoder-only (GPT-style) layer: self-attention that sees only earlier tokens."""

    def __init__(self):
        super().__init__(D, HEADS, dim_feedforward=4 * D, dropout=0.1, activation="gelu", batch_first=True,
                         norm_first=True)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return super().forward(x, src_mask=mask, is_causal=True)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.out = nn.Linear(D, VOCAB, bias=False)

    def forward(self, x):
        return self.out(self.norm(x))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = Embedding()
        self.layers = nn.Sequential(*[CausalLayer() for _ in range(LAYERS)])
        self.head = Head()

    def forward(self, tokens):
        return self.head(self.layers(self.embed(tokens)))


def build():
    data = torch.Generator().manual_seed(1)

    def batch():
        t = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=data)
        return t[:, :-1], t[:, 1:]

    def loss(logits, targets):
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return {"model": TinyLM(), "batch": batch, "loss": loss, "tokens_per_sample": SEQ,
            "blocks": ["embed", *(f"layers.{i}" for i in range(LAYERS)), "head"]}
