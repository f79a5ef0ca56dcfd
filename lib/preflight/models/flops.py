"""Training FLOPs of a Transformer and model FLOPs utilisation (MFU).

Per token, forward + backward of a decoder Transformer costs about ``6 N`` FLOPs for the weight
matmuls (2 forward, 4 backward per parameter; Kaplan et al. 2020) plus ``12 L h s`` for attention
scores and their weighted sums (``QK^T`` and ``AV``: 2 matmuls x 2 FLOPs x ``s h`` per layer, times
3 for forward + backward; Chinchilla appendix F, PaLM appendix B). Here ``N`` is the parameter count
(embedding excluded by the strict convention), ``L`` layers, ``h`` hidden size, ``s`` sequence length.

``MFU = achieved model FLOP/s / peak FLOP/s``. Use the dense peak of the exact chip. When the peak
is unknown, MFU is ``None``: a guessed denominator gives a number that looks precise and means nothing.
"""
from __future__ import annotations


def train_flops_per_token(params: float, layers: int, hidden: int, seq_len: int) -> float:
    """``6 N + 12 L h s`` FLOPs per token for one training step (forward + backward)."""
    for name, v in (("params", params), ("layers", layers), ("hidden", hidden), ("seq_len", seq_len)):
        if v <= 0:
            raise ValueError(f"{name} must be > 0 (got {v})")
    return 6.0 * params + 12.0 * layers * hidden * seq_len


def mfu(achieved_flops_per_s: float, peak_tflops: float | None) -> float | None:
    """Fraction of the peak reached (0..1), or None when the peak is unknown."""
    if peak_tflops is None or peak_tflops <= 0:
        return None
    return achieved_flops_per_s / (peak_tflops * 1e12)
