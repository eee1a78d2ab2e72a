"""Trains normally; under the memory estimator's fake tensors the process dies of a segfault, as a
bug in a C extension would: the search must report it and go on probing for real."""
import ctypes

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from autofit import autofit


@autofit(batch_range=(4, 32))
def train(run):
    model = torch.nn.Linear(32, 32).to(run.device)
    if isinstance(model.weight, FakeTensor):
        ctypes.string_at(0)  # SIGSEGV
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(run.batch_size, 32), torch.randn(run.batch_size, 32)) for _ in range(8)]
    while True:
        for x, y in run.batches(data):
            with run.autocast():
                loss = F.mse_loss(model(x), y)
            run.backward(loss, opt)
