"""Keeps 200 MiB per probe in a module-level list: memory that never returns to baseline."""
import torch

from autofit import autofit

KEPT = []


@autofit
def train(run):
    KEPT.append(torch.ones(50 * 2**20))  # 200 MiB, never freed
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    while True:
        for x in run.batches([torch.randn(run.batch_size, 4)] * 4):
            run.backward(model(x).mean(), opt)
