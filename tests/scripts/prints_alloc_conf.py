"""Prints the allocator settings its probe process runs under, then trains a small model."""
import os

import torch

from autofit import autofit


@autofit(batch_range=(4, 16), precision="fp32")
def train(run):
    print(f"alloc conf: {os.environ.get('PYTORCH_CUDA_ALLOC_CONF')}", flush=True)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    while True:
        for x in run.batches([torch.randn(run.batch_size, 16)] * 4):
            with run.autocast():
                loss = model(x).pow(2).mean()
            run.backward(loss, opt)
