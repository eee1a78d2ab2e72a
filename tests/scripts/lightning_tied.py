"""A LightningModule whose token embedding and output layer share one weight (a small language
model), logging its loss (Lightning reads its value), through AutofitLightningTrainer."""
import os

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from autofit import autofit
from autofit.integrations.lightning import AutofitLightningTrainer

VOCAB, T, D = 512, 32, 128
DATA = TensorDataset(torch.randint(0, VOCAB, (512, T + 1), generator=torch.Generator().manual_seed(0)))


class TiedLM(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D)
        self.body = torch.nn.Sequential(torch.nn.LayerNorm(D), torch.nn.Linear(D, 4 * D), torch.nn.GELU(),
                                        torch.nn.Linear(4 * D, D))
        self.head = torch.nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def training_step(self, batch, batch_idx):
        (seq,) = batch
        logits = self.head(self.body(self.embed(seq[:, :-1])))
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


@autofit(global_batch=32, default_batch_size=8)
def train(run):
    torch.manual_seed(0)
    trainer = AutofitLightningTrainer(run, max_epochs=1, logger=False, enable_checkpointing=False,
                                      enable_progress_bar=False, gradient_clip_val=1.0,
                                      default_root_dir=os.environ.get("PL_OUT", "pl_out"))
    trainer.fit(TiedLM(), DataLoader(DATA, batch_size=run.batch_size))


if __name__ == "__main__":
    train()
