import torch

from autofit import autofit


@autofit
def train(run):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    while True:
        for x in run.batches([torch.randn(run.batch_size, 4)] * 4):
            loss = model(x).mean() * float("inf")
            run.backward(loss, opt)
