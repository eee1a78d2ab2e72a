"""A loop that reads the loss's value every step (loss.item()): it trains normally, but on fake
tensors there is no value to read, so the memory estimator must say it has no estimate, and why."""
import torch
import torch.nn.functional as F

from autofit import autofit


@autofit
def train(run):
    model = torch.nn.Linear(32, 32).to(run.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(run.batch_size, 32), torch.randn(run.batch_size, 32)) for _ in range(8)]
    while True:
        for x, y in run.batches(data):
            with run.autocast():
                loss = F.mse_loss(model(x), y)
            if loss.item() > 1e6:
                raise RuntimeError("diverged")
            run.backward(loss, opt)
