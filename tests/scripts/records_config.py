"""Writes the config it was called with (and the allocator settings it ran under) to $RECORD_TO, so a test can
see what a normal call used."""
import json
import os

import torch

from autofit import autofit


@autofit
def train(run):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in run.batches([torch.randn(run.batch_size, 4)] * 3):
        with run.autocast():
            loss = model(x).float().pow(2).mean()
        run.backward(loss, opt)
    with open(os.environ["RECORD_TO"], "w") as handle:
        json.dump({"batch_size": run.batch_size, "precision": run.precision,
                   "probing": run.probing, "steps": run.optimizer_steps,
                   "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}, handle)


if __name__ == "__main__":
    train()
