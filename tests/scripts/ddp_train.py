"""A data-parallel train function as autofit documents it: `run.distribute(model)` (DDP under
torchrun), `run.sampler(data)` (each rank its shard), `run.batches()` and `run.backward()`.
Run normally it is one process; under `torchrun --nproc-per-node 2` two ranks split each global batch.

SPLIT_CONFIGS=a.json,b.json gives each rank its own best-config file (machines that disagree);
SHARD=1 shards the model with FSDP2 (its two Linear layers, then the root) instead of DDP.
BLOCKS=1 offers the two layers to run.distribute(blocks=...): the config's sharding decides.
EPOCHS=N trains N epochs of 512 samples (default 1) when run normally.
Writes the main rank's final weights to $WEIGHTS_OUT (torch.save).
PIDS_OUT=path: each call appends its rank, its process id and its parent's.
"""
import itertools
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from autofit import autofit

_g = torch.Generator().manual_seed(0)
DATA = TensorDataset(torch.randn(512, 16, generator=_g), torch.randn(512, 1, generator=_g))


@autofit(global_batch=32, default_batch_size=8)
def train(run):
    if os.environ.get("PIDS_OUT"):
        with open(os.environ["PIDS_OUT"], "a") as out:
            out.write(f"{run.rank} {os.getpid()} {os.getppid()}\n")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    layers = [model[0], model[2]]
    if os.environ.get("BLOCKS"):  # the config's sharding decides (searched)
        model = run.distribute(model, blocks=layers)
    else:
        model = run.distribute(model, shard=layers if os.environ.get("SHARD") else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(DATA, batch_size=run.batch_size, sampler=run.sampler(DATA, shuffle=False))
    epochs = int(os.environ.get("EPOCHS", "1"))
    for _ in itertools.count() if run.probing else range(epochs):  # a probe runs until it has its steps
        for x, y in run.batches(loader):
            with run.autocast():
                loss = F.mse_loss(model(x), y)
            run.backward(loss, opt)
    if run.probing:
        return
    # Whole tensors (an FSDP2 shard is gathered from every rank: all ranks take part).
    weights = {k.removeprefix("module."): v.full_tensor() if hasattr(v, "full_tensor") else v
               for k, v in model.state_dict().items()}
    if run.is_main:
        torch.save(weights, os.environ["WEIGHTS_OUT"])
        print(f"ddp_train: world {run.world_size} micro {run.batch_size} accumulation {run.accumulation_steps} "
              f"global {run.global_batch} steps {run.optimizer_steps}", flush=True)


if __name__ == "__main__":
    if os.environ.get("SPLIT_CONFIGS"):
        os.environ["AUTOFIT_CONFIG"] = os.environ["SPLIT_CONFIGS"].split(",")[int(os.environ.get("RANK", "0"))]
    train()
