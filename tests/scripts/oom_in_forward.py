"""Every forward from optimizer step $OOM_FROM_STEP on asks for 4 GiB per sample: no micro-batch fits."""
import os

import torch

from autofit import autofit

FROM_STEP = int(os.environ.get("OOM_FROM_STEP", "0"))


@autofit(default_batch_size=4)
def train(run):
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [torch.randn(run.batch_size, 8) for _ in range(10)]
    for x in run.batches(data):
        with run.autocast():
            if run.optimizer_steps >= FROM_STEP:
                torch.ones(len(x), 2**30)
            loss = model(x).pow(2).mean()
        run.backward(loss, opt)


if __name__ == "__main__":
    train()
