"""Memory grows ~linearly with batch: each sample carries a 1 MiB activation (256Ki floats)."""
import torch

from autofit import autofit

WIDTH = 256 * 1024  # floats per sample in the activation


def train_steps(run, say=None):
    """The training loop, shared with fits_small_prints.py; `say` gets a line per step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    blocks = torch.nn.ModuleList([torch.nn.Linear(64, 64) for _ in range(4)])
    run.checkpoint(blocks)
    opt = torch.optim.SGD(list(model.parameters()) + list(blocks.parameters()), lr=0.01)
    data = [torch.randn(run.batch_size, 64) for _ in range(4)]
    step = 0
    while True:
        for x in run.batches(data):
            with run.autocast():
                h = x
                for block in blocks:
                    h = torch.relu(block(h))
                wide = h.repeat(1, WIDTH // 64)  # batch x 1 MiB, kept for backward
                loss = model(h).pow(2).mean() + wide.sigmoid().mean() * 1e-3  # bounded below: never diverges
            run.backward(loss, opt)
            step += 1
            if say is not None:
                say(f"step {step} loss {loss.item():.4f}")


@autofit(batch_range=(1, 2048))
def train(run):
    train_steps(run)
