"""Trains a few steps, then one of its steps never ends (a collective that deadlocks, a loader stuck on a
dead file server): the probe made progress, then stopped making it."""
import time

import torch

from autofit import autofit


@autofit
def train(run):
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, x in enumerate(run.batches(torch.randn(run.batch_size, 8) for _ in range(10**6))):
        if step == 3:
            time.sleep(3600)
        with run.autocast():
            loss = model(x).pow(2).mean()
        run.backward(loss, opt)
