"""Segfaults at batch sizes >= 8 (a stand-in for a crashing CUDA kernel), runs fine below."""
import ctypes

import torch

from autofit import autofit


@autofit
def train(run):
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if run.batch_size >= 8:
        ctypes.string_at(0)  # SIGSEGV
    while True:
        for x in run.batches([torch.randn(run.batch_size, 8)] * 4):
            run.backward(model(x).mean(), opt)
