"""A workload written only for the tests: not a Transformer, with closed-form counts.

Conv2d(3 -> 8, 3x3, padding 1) on 8x8 images, ReLU, Flatten, Linear(512 -> 64), ReLU, Linear(64 -> 10).
tests/test_workload.py checks the audit's parameter count (exact) and FLOPs per sample (within 1 %)
against PARAMS and FLOPS_PER_SAMPLE below.
"""
import torch
from torch import nn
from torch.nn import functional as F

C_IN, C_OUT, K, HW, HIDDEN, CLASSES, BATCH = 3, 8, 3, 8, 64, 10, 4
FLAT = C_OUT * HW * HW
PARAMS = (C_OUT * C_IN * K * K + C_OUT) + (FLAT * HIDDEN + HIDDEN) + (HIDDEN * CLASSES + CLASSES)
# Forward: 2 multiply-adds counted per weight use. Backward: the weight gradient costs the forward
# again, the input gradient too, except for the first layer (its input needs no gradient). Bias adds,
# ReLU and the loss are not matmul FLOPs (FlopCounterMode counts matmuls and convolutions).
CONV = 2 * C_OUT * C_IN * K * K * HW * HW
FLOPS_PER_SAMPLE = 2 * CONV + 6 * FLAT * HIDDEN + 6 * HIDDEN * CLASSES


class ConvMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C_IN, C_OUT, K, padding=1)
        self.fc1 = nn.Linear(FLAT, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(F.relu(self.conv(x)).flatten(1))))


def build():
    g = torch.Generator().manual_seed(0)
    return {"model": ConvMLP(),
            "batch": lambda: (torch.randn(BATCH, C_IN, HW, HW, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)),
            "loss": F.cross_entropy}
