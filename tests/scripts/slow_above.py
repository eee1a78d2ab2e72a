"""Batches below 8 take a few milliseconds a step; batch 8 and above take 0.5 s, long enough for a
test to kill the searching process in the middle of that probe."""
import time

import torch

from autofit import autofit


@autofit(precision=("fp32",), batch_range=(1, 16))
def train(run):
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    while True:
        for x in run.batches([torch.randn(run.batch_size, 8)] * 4):
            if run.batch_size >= 8:
                time.sleep(0.5)
            run.backward(model(x).pow(2).mean(), opt)
