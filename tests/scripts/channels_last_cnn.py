"""A small convolution model that offers its model to run.channels_last(): a search tries the format on its
fastest config; the normal run says which format its weights trained in."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import autofit

torch.manual_seed(0)
IMAGES, LABELS = torch.randn(512, 3, 32, 32), torch.randint(0, 10, (512,))


@autofit.autofit
def train(run):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).to(run.device)
    model = run.channels_last(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(IMAGES, LABELS),
                                         batch_size=run.batch_size, shuffle=True, drop_last=True)
    for _ in range(1 if not run.probing else 10**6):
        for images, labels in run.batches(loader):
            with run.autocast():
                loss = F.cross_entropy(model(images), labels)
            run.backward(loss, optimizer)
    if not run.probing:
        print(f"channels_last {model[0].weight.is_contiguous(memory_format=torch.channels_last)}")


if __name__ == "__main__":
    train()
