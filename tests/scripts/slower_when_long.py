"""Batch 16 is the fastest per sample over a probe's few steps, but slows down after 30 steps (a run
that heats up, a cache that fills): its long confirmation run measures it below batch 12."""
import time

import torch

from autofit import autofit


@autofit(precision=("fp32",), batch_range=(8, 16))
def train(run):
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    while True:
        for x in run.batches([torch.randn(run.batch_size, 8)] * 4):
            steps += 1
            time.sleep(0.08 if run.batch_size >= 16 and steps > 30 else 0.02)
            run.backward(model(x).pow(2).mean(), opt)
