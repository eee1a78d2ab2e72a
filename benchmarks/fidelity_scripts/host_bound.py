"""A host-bound model: a deep, narrow MLP (24 blocks of Linear 64, LayerNorm, GELU) at small micro-batches, whose
step is mostly Python and kernel launches, not arithmetic. Its forward saves about a hundred tensors for backward,
so a Python call per saved tensor (the saved-tensor hooks a normal run that recovers from OOMs runs under
`run.autocast()`: autofit/runtime/_saved.py) is about a tenth of its step: the case where a probe that did not run
those hooks read about 12% faster than its normal run (issue 52, item 4)."""

from __future__ import annotations

import os

import torch
import torch.nn as nn

from autofit import autofit

WIDTH, BLOCKS = 64, 24
STEPS = int(os.environ.get("HOST_BOUND_STEPS", "1500"))  # the normal run's optimizer steps


def build() -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(BLOCKS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 1))


@autofit(default_batch_size=8, batch_range=(1, 64))
def train(run) -> float:
    torch.manual_seed(0)
    model = build().to(run.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(4096, WIDTH)
    batches = [data[i:i + run.batch_size] for i in range(0, len(data) - run.batch_size + 1, run.batch_size)]
    steps, loss = 0, torch.tensor(0.0)
    while run.probing or steps < STEPS:
        for x in run.batches(batches):
            with run.autocast():
                loss = model(x).square().mean()
            run.backward(loss, optimizer)
            steps += 1
            if not run.probing and steps >= STEPS:
                break
    return float(loss.detach())


if __name__ == "__main__":
    train()
