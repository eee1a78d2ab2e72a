"""Memory grows ~linearly with batch: each sample carries a 1 MiB activation (256Ki floats)."""
import torch

from autofit import autofit

WIDTH = 256 * 1024  # floats per sample in the activation


@autofit(batch_size=(1, 2048))
def train(run):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    blocks = torch.nn.ModuleList([torch.nn.Linear(64, 64) for _ in range(4)])
    run.checkpoint(blocks)
    opt = torch.optim.SGD(list(model.parameters()) + list(blocks.parameters()), lr=0.01)
    data = [torch.randn(run.batch_size, 64) for _ in range(4)]
    while True:
        for x in run.batches(data):
            with run.autocast():
                h = x
                for block in blocks:
                    h = torch.relu(block(h))
                wide = h.repeat(1, WIDTH // 64)  # batch x 1 MiB, kept for backward
                loss = model(h).mean() + wide.sigmoid().mean() * 1e-3
            run.backward(loss, opt)
