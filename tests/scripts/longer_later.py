"""Memory need grows mid-training: sequences of 16 tokens for the first 6 steps of 32 samples, then
2048 tokens (a later part of a corpus with longer documents). Under a memory limit that fits the
short sequences at batch 32 but not the long ones, the real run must lower its micro-batch, keep
the global batch and train to the end.

Writes {"step_losses": {step: mean loss}, "weights": state_dict} to $LOSSES_OUT (torch.save).
With HOLD_OUTPUTS=1 the loop keeps each micro-batch's outputs in a variable until the next forward assigns it
again, as many loops keep their logits: a step that fails then holds its graph through them.
"""
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from autofit import autofit

D = 128
SHORT, LONG = 16, int(os.environ.get("LONG_TOKENS", "2048"))
SAMPLES = 32 * 12
SHORT_SAMPLES = 32 * 6 if os.environ.get("SHORT_FIRST", "1") != "0" else 0


class Growing(Dataset):
    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(SHORT if i < SHORT_SAMPLES else LONG, D, generator=g)
        return x, x.roll(1, dims=-1)


@autofit(default_batch_size=32)
def train(run):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(D, 4 * D), torch.nn.GELU(), torch.nn.Linear(4 * D, D))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = DataLoader(Growing(), batch_size=run.batch_size, shuffle=False)
    step_losses = {}
    hold = os.environ.get("HOLD_OUTPUTS") == "1"
    for x, y in run.batches(loader):
        with run.autocast():
            if hold:
                outputs = model(x)
                loss = F.mse_loss(outputs, y)
            else:
                loss = F.mse_loss(model(x), y)
        if run.micro_step == 0:  # a step begins (again, after an OOM): start its sum afresh
            step_losses[run.optimizer_steps] = []
        step_losses[run.optimizer_steps].append(loss.item())
        run.backward(loss, opt)
    means = {step: sum(values) / len(values) for step, values in step_losses.items()}
    torch.save({"step_losses": means, "weights": model.state_dict()}, os.environ["LOSSES_OUT"])


if __name__ == "__main__":
    train()
