"""A Lightning script with a validation loop left at Lightning's defaults (a sanity check of 2 batches
before training, validation at each epoch's end), 8 micro-batches an epoch. Each training and validation
step appends a line to $EVENTS_OUT, so a test sees what a probe and a normal run each did, in order."""
import os

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from autofit import autofit
from autofit.integrations.lightning import AutofitLightningTrainer

_g = torch.Generator().manual_seed(0)
TRAIN = TensorDataset(torch.randn(64, 32, generator=_g), torch.randn(64, 32, generator=_g))
VAL = TensorDataset(torch.randn(32, 32, generator=_g), torch.randn(32, 32, generator=_g))


def _event(name: str) -> None:
    with open(os.environ["EVENTS_OUT"], "a") as handle:
        handle.write(name + "\n")


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 32)

    def training_step(self, batch, batch_idx):
        _event("train")
        x, y = batch
        return F.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        _event("validation")
        x, y = batch
        self.log("val_loss", F.mse_loss(self.layer(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@autofit(global_batch=8)
def train(run):
    torch.manual_seed(0)
    trainer = AutofitLightningTrainer(run, max_epochs=1, logger=False, enable_checkpointing=False,
                                      enable_progress_bar=False, default_root_dir=os.environ.get("PL_OUT", "pl_out"))
    trainer.fit(Regressor(), DataLoader(TRAIN, batch_size=run.batch_size), DataLoader(VAL, batch_size=8))


if __name__ == "__main__":
    train()
