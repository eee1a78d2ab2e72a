"""Raises what PyTorch raises after an illegal memory access on a GPU (a sticky CUDA error) at
batch >= 8; smaller batches train. The CPU stands in for the GPU: the message is what counts."""
import torch

from autofit import autofit


@autofit
def train(run):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    while True:
        for x in run.batches([torch.randn(run.batch_size, 4)] * 4):
            if run.batch_size >= 8:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            run.backward(model(x).mean(), opt)
