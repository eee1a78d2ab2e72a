"""A small convolutional image classifier: activation-dominated memory, lopsided across stages.

Shape: the weights are tiny (~0.3M parameters), but every conv/BN/ReLU layer keeps full-size
feature maps for backward (~2 MiB per 64x64 image in fp32), so memory grows steeply with the
micro-batch: under a 1.5 GiB cap on CPU fp32 just fits batch 512 and runs out of memory before
768. bf16 shrinks the saved feature maps (batch 1024 fits). Checkpointing the four conv stages
buys little here, unlike in gpt.py: the full-resolution first stage holds about half of all
activations, and backward has to rebuild it whole, so the peak drops only ~15-20% for the price
of a second forward pass. A search should find that out and not pay for it.

The images are synthetic, generated at import (nothing is downloaded): each class is a colored
sinusoidal grating with its own orientation and frequency, shifted at random per image, plus noise.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from autofit import autofit
from autofit.runtime import Run

IMAGE_SIZE = 64
N_CLASSES = 10
N_IMAGES = 2048
WIDTHS = (16, 32, 64, 128)  # channels of the four conv stages; each stage halves the resolution
EPOCHS = 3


# --- data ---------------------------------------------------------------------------------------
def make_images(
    n: int = N_IMAGES, size: int = IMAGE_SIZE, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` uint8 RGB images (n, 3, size, size) and their labels, from a seed."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, N_CLASSES, (n,), generator=g)
    angle = torch.arange(N_CLASSES) * math.pi / N_CLASSES  # class: orientation ...
    freq = 2 * math.pi * (2 + torch.arange(N_CLASSES) % 3) / size  # ... frequency ...
    color = torch.rand(N_CLASSES, 3, generator=g) * 2 - 1  # ... and color balance
    ys, xs = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    a, f = angle[labels].view(n, 1, 1), freq[labels].view(n, 1, 1)
    phase = torch.rand(n, 1, 1, generator=g) * 2 * math.pi  # per-image shift
    grating = torch.sin(f * (xs * torch.cos(a) + ys * torch.sin(a)) + phase)
    images = grating.unsqueeze(1) * color[labels].view(n, 3, 1, 1)
    images = images + 0.8 * torch.randn(n, 3, size, size, generator=g)
    return ((images.clamp(-2, 2) + 2) * 63.75).to(torch.uint8), labels


IMAGES, LABELS = make_images()  # generated once, at import: probes do not pay for it
DATASET = TensorDataset(IMAGES, LABELS)


# --- model --------------------------------------------------------------------------------------
def conv_bn_relu(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(),
    )


class ConvNet(nn.Module):
    """Four conv stages (the `blocks`), global average pooling and a linear classifier."""

    def __init__(self, widths: tuple[int, ...] = WIDTHS, classes: int = N_CLASSES) -> None:
        super().__init__()
        stages = []
        c_in = 3
        for i, c in enumerate(widths):  # two conv layers; later stages halve the size
            stride = 1 if i == 0 else 2
            stages.append(nn.Sequential(conv_bn_relu(c_in, c, stride), conv_bn_relu(c, c)))
            c_in = c
        self.blocks = nn.ModuleList(stages)
        self.head = nn.Linear(c_in, classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = images.float() / 127.5 - 1  # uint8 -> [-1, 1]
        for block in self.blocks:
            h = block(h)
        logits = self.head(h.mean(dim=(2, 3)))
        return F.cross_entropy(logits.float(), labels)


# --- training -----------------------------------------------------------------------------------
@autofit(default_batch_size=64)
def train(run: Run) -> float:
    """Train the classifier for EPOCHS; return the last loss."""
    torch.manual_seed(0)
    model = ConvNet().to(run.device)
    run.checkpoint(model.blocks)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    loader = DataLoader(DATASET, batch_size=run.batch_size, shuffle=True, drop_last=True)
    loss = torch.tensor(math.nan)
    for epoch in range(EPOCHS if not run.probing else 10**6):  # a probe ends by itself
        for images, labels in run.batches(loader):
            with run.autocast():
                loss = model(images, labels)
            run.backward(loss, opt)
        if not run.probing:
            print(f"cnn: epoch {epoch + 1}, loss {loss.item():.3f}")
    return loss.item()


if __name__ == "__main__":
    train()
