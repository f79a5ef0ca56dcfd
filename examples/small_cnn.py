"""A workload for ``python -m preflight audit examples/small_cnn.yaml``: a small CNN image classifier.

Two convolution stages (conv, batch norm, ReLU, max-pool) and a linear classifier over 10 classes,
on random 3 x 32 x 32 images (CIFAR-sized) from the workload's own seeded generator. Batch norm keeps
running statistics (buffers): state a resume must restore with the weights. The default blocks (the
top-level children, in order) run in sequence.
"""
import torch
from torch import nn
from torch.nn import functional as F

BATCH, CLASSES = 16, 10


def stage(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.MaxPool2d(2))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stage1 = stage(3, 32)
        self.stage2 = stage(32, 64)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.1), nn.Linear(64 * 8 * 8, CLASSES))

    def forward(self, images):
        return self.classifier(self.stage2(self.stage1(images)))


def build():
    data = torch.Generator().manual_seed(1)

    def batch():
        images = torch.randn(BATCH, 3, 32, 32, generator=data)
        labels = torch.randint(0, CLASSES, (BATCH,), generator=data)
        return images, labels

    return {"model": SmallCNN(), "batch": batch, "loss": F.cross_entropy,
            "optimizer": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9)}
