"""A decorated function whose copy a test widens between two searches of one study (a script changed since
its probes): each sample keeps WIDTH floats for backward; a normal run trains one pass and stops."""
import torch

from autofit import autofit

WIDTH = 16 * 1024  # floats per sample kept for backward (64 KiB)


@autofit
def train(run):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [torch.randn(run.batch_size, 64) for _ in range(4)]
    for _ in range(1 if not run.probing else 10**6):
        for x in run.batches(data):
            with run.autocast():
                wide = x.repeat(1, WIDTH // 64)
                loss = model(x).pow(2).mean() + wide.sigmoid().mean() * 1e-3  # bounded below: never diverges
            run.backward(loss, opt)


if __name__ == "__main__":
    train()
