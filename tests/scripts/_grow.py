"""Shared body of the fault scripts: memory grows ~1 MiB per sample, steps take milliseconds."""
import torch


def train_steps(run, on_step=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [torch.randn(run.batch_size, 32) for _ in range(2)]
    while True:
        for x in run.batches(data):
            with run.autocast():
                wide = x.repeat(1, 8192)  # batch x 1 MiB in fp32, kept for backward by sigmoid
                loss = model(x).float().pow(2).mean() + wide.sigmoid().float().mean() * 1e-3  # bounded below: no divergence however many steps
            if on_step is not None:
                loss = on_step(run, loss)
            run.backward(loss, opt)
