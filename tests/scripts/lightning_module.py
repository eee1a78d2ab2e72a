"""A Lightning script as people write them, with the three lines autofit needs (marked): a
LightningModule of residual MLP blocks over token sequences, generated data."""
import os

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from autofit import autofit  # autofit: 1
from autofit.integrations.lightning import AutofitLightningTrainer  # autofit: 2

T, D = 64, 256
_g = torch.Generator().manual_seed(0)
DATA = TensorDataset(torch.randn(1024, T, D, generator=_g), torch.randn(1024, T, D, generator=_g))


class Blocks(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.LayerNorm(D), torch.nn.Linear(D, 4 * D), torch.nn.GELU(),
                                torch.nn.Linear(4 * D, D)) for _ in range(4))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


@autofit(global_batch=64, default_batch_size=16)  # autofit: 3 (a function around the Trainer)
def train(run):
    torch.manual_seed(0)
    model = Blocks()
    loader = DataLoader(DATA, batch_size=run.batch_size, shuffle=False)
    trainer = AutofitLightningTrainer(run, max_epochs=1, accumulate_grad_batches=4, logger=False,
                                      enable_checkpointing=False, enable_progress_bar=False,
                                      default_root_dir=os.environ.get("PL_OUT", "pl_out"))  # was: L.Trainer(...)
    trainer.fit(model, loader)
    print(f"lightning_module: precision {trainer.precision} accumulation {trainer.accumulate_grad_batches} "
          f"micro-batch {loader.batch_size} steps {trainer.global_step}", flush=True)


if __name__ == "__main__":
    train()
