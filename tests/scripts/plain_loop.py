"""Uses only run.batch_size and run.batches(): no autocast, no checkpointing, no run.backward."""
import torch

from autofit import autofit


@autofit(batch_range=(1, 256))
def train(run):
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [torch.randn(run.batch_size, 16) for _ in range(2)]
    while True:
        for x in run.batches(data):
            keep = x.repeat(1, 16384).sigmoid()  # ~1 MiB per sample in fp32, saved for backward
            loss = model(x).pow(2).mean() + keep.mean() * 1e-3
            loss.backward()
            opt.step()
            opt.zero_grad()
