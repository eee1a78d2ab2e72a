"""A torchrun DDP script in the style of PyTorch's DDP tutorial / pytorch/examples
distributed/ddp-tutorial-series/multigpu_torchrun.py, converted for autofit.

The script as it was (the lines that changed):

    dist.init_process_group(backend="nccl")                 # ddp_setup()
    local_rank = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(local_rank)
    model = ToyNet().to(local_rank)
    model = DDP(model, device_ids=[local_rank])
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, shuffle=False, sampler=sampler)
    for epoch in range(max_epochs):
        sampler.set_epoch(epoch)
        for source, targets in loader:
            source, targets = source.to(local_rank), targets.to(local_rank)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(source), targets)
            loss.backward()
            optimizer.step()
    if global_rank == 0: torch.save(model.module.state_dict(), "checkpoint.pt")
    dist.destroy_process_group()

Converted (marked `# autofit`), as README "Data parallel under torchrun" says: the process group,
the device and DDP become `run.distribute(model)`, the DistributedSampler `run.sampler(dataset)`, the
loop `run.batches()` / `run.autocast()` / `run.backward()`, the rank checks `run.is_main`; autofit
leaves the process group it joined when the function returns. The checkpoint is saved from the model
as built (`raw`): under DDP `run.distribute` returns the DDP wrapper (its `.module` is `raw`), in one
process `raw` itself, so `raw.state_dict()` has the same keys either way.
Runs as one process (`python ddp_converted.py`) or under `torchrun --nproc-per-node 2` (gloo on CPU).
"""

from __future__ import annotations

import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from autofit import autofit  # autofit

_generator = torch.Generator().manual_seed(0)
_features = torch.randn(2048, 32, generator=_generator)
DATASET = TensorDataset(_features, (_features[:, :4].sum(1) > 0).long() + (_features[:, 4:8].sum(1) > 0).long())


class ToyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 3))

    def forward(self, x):
        return self.net(x)


class Trainer:
    """The tutorial's Trainer class: it keeps the model, the loader and the optimizer."""

    def __init__(self, run, model, train_data, optimizer, save_every: int, snapshot_path: str) -> None:
        self.run = run  # autofit: was self.local_rank / self.global_rank from the environment
        self.raw = model  # autofit: what to save (below)
        self.model = run.distribute(model)  # autofit: was model.to(local_rank); DDP(model, device_ids=[local_rank])
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.epochs_run = 0

    def _run_batch(self, source, targets):
        with self.run.autocast():  # autofit
            output = self.model(source)
            loss = F.cross_entropy(output.float(), targets)
        self.run.backward(loss, self.optimizer)  # autofit: was zero_grad(); loss.backward(); step()
        return loss

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        for step, (source, targets) in enumerate(self.run.batches(self.train_data)):  # autofit: no .to(local_rank)
            loss = self._run_batch(source, targets)
            if self.run.is_main and step % 20 == 0:  # autofit: was self.global_rank == 0
                print(f"[GPU{self.run.rank}] Epoch {epoch} | step {step} | loss {loss.item():.4f}", flush=True)

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.raw.state_dict(), "EPOCHS_RUN": epoch}  # autofit: was self.model.module
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs: int):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.run.is_main and epoch % self.save_every == 0 and not self.run.probing:  # autofit
                self._save_snapshot(epoch)


@autofit(global_batch=64, default_batch_size=32)  # autofit: the global batch of 2 ranks x 32
def main(run, total_epochs: int = 3, save_every: int = 1, snapshot_path: str = "snapshot.pt"):
    torch.manual_seed(0)
    model = ToyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    train_data = DataLoader(DATASET, batch_size=run.batch_size, pin_memory=False, shuffle=False,
                            sampler=run.sampler(DATASET))  # autofit: was DistributedSampler(DATASET)
    trainer = Trainer(run, model, train_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs if not run.probing else 10**6)  # autofit
    if run.is_main:
        print(f"ddp_converted: world {run.world_size} micro {run.batch_size} accumulation "
              f"{run.accumulation_steps} global {run.global_batch} steps {run.optimizer_steps}", flush=True)
    # autofit: was dist.destroy_process_group() (autofit leaves the group it joined)


if __name__ == "__main__":
    main(total_epochs=int(os.environ.get("EPOCHS", "3")), snapshot_path=os.environ.get("SNAPSHOT", "snapshot.pt"))
