"""A Lightning run whose memory need grows mid-training: 16-token sequences for the first 6 optimizer
steps of 32 samples, then LONG_TOKENS-token ones. Under a memory limit that fits the short ones at the
exported micro-batch but not the long ones, AutofitLightningTrainer must lower its micro-batch, keep
the global batch and train to the end.

Writes {"step_losses": {step: mean loss}, "weights": state_dict} to $LOSSES_OUT (torch.save); each
sample's loss is recorded by its index, so a micro-batch run again after an OOM is not counted twice.
"""
import os

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from autofit import autofit
from autofit.integrations.lightning import AutofitLightningTrainer

D, SHORT, LONG = 128, 16, int(os.environ.get("LONG_TOKENS", "1024"))
GLOBAL, STEPS, SHORT_STEPS = 32, 12, 6


class Growing(Dataset):
    def __len__(self) -> int:
        return GLOBAL * STEPS

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(SHORT if i < GLOBAL * SHORT_STEPS else LONG, D, generator=g)
        return x, x.roll(1, dims=-1), i


class Blocks(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(D, 4 * D), torch.nn.GELU(), torch.nn.Linear(4 * D, D))
            for _ in range(2))
        self.sample_losses: dict[int, dict[int, float]] = {}

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x

    def training_step(self, batch, batch_idx):
        x, y, index = batch
        per_sample = F.mse_loss(self(x), y, reduction="none").mean(dim=(1, 2))
        step = self.sample_losses.setdefault(self.trainer.global_step, {})
        step.update(zip(index.tolist(), per_sample.detach().tolist()))
        return per_sample.mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


@autofit(global_batch=GLOBAL, default_batch_size=GLOBAL)
def train(run):
    torch.manual_seed(0)
    model = Blocks()
    loader = DataLoader(Growing(), batch_size=run.batch_size, shuffle=False)
    trainer = AutofitLightningTrainer(run, max_epochs=1, logger=False, enable_checkpointing=False,
                                      enable_progress_bar=False, enable_model_summary=False,
                                      default_root_dir=os.environ.get("PL_OUT", "pl_out"))
    trainer.fit(model, loader)
    means = {step: sum(losses.values()) / len(losses) for step, losses in model.sample_losses.items()}
    torch.save({"step_losses": means, "weights": model.state_dict()}, os.environ["LOSSES_OUT"])
    print(f"lightning_longer_later: accumulation {trainer.accumulate_grad_batches} micro-batch {loader.batch_size} "
          f"steps {trainer.global_step}", flush=True)


if __name__ == "__main__":
    train()
