"""Offers its model to run.compile() with a backend that always fails, as a model inductor cannot
compile would: the compiled strategy is dropped after its failure and the search goes on eager."""
import torch
import torch.nn.functional as F

from autofit import autofit


def broken_backend(graph_module, example_inputs):
    raise RuntimeError("this backend cannot compile anything")


@autofit(batch_range=(16, 64), precision="fp32")
def train(run):
    model = run.compile(torch.nn.Linear(32, 1).to(run.device), backend=broken_backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(run.batch_size, 32), torch.randn(run.batch_size, 1)) for _ in range(8)]
    while True:
        for x, y in run.batches(data):
            with run.autocast():
                loss = F.mse_loss(model(x), y)
            run.backward(loss, opt)
