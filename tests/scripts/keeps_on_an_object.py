"""A model built at import, and each call hangs 128 MiB on it (an attribute of an object changed in place:
nothing a persistent worker can put back, as a framework's state kept on a prepared model is not). In one
process, a probe would find every earlier probe's memory on top of its own."""
import torch

from autofit import autofit

model = torch.nn.Linear(8, 1)
model.kept = []


@autofit(batch_range=(4, 64))
def train(run):
    model.kept.append(torch.ones(32 * 2**20))  # 128 MiB a call, never freed
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [torch.randn(run.batch_size, 8) for _ in range(4)]
    while True:
        for x in run.batches(data):
            run.backward(model(x).pow(2).mean(), opt)
