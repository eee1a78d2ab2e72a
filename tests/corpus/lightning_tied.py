"""A LightningModule language model in the style of Lightning's own examples (a small transformer
LM, lightning.pytorch.demos style): token embedding and output layer share one weight (tied), a
ModuleList of TransformerEncoderLayer blocks with a causal mask, `self.log("train_loss", ...)`,
`configure_optimizers` returning AdamW with a per-step LambdaLR warm-up, a validation step, and
`trainer.fit(model, train_loader, val_loader)` then `trainer.save_checkpoint(...)`.

Changed for autofit (marked `# autofit`), as README "A Lightning script, searched as it is" says: the
two imports, the decorator on a function around the Trainer, the train loader's batch size from
`run.batch_size`, and `AutofitLightningTrainer(run, ...)` where the script built `L.Trainer(...)`.

Tokens are a seeded random stream generated at import (no download).
"""

from __future__ import annotations

import os

import lightning.pytorch as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from autofit import autofit  # autofit
from autofit.integrations.lightning import AutofitLightningTrainer  # autofit

VOCAB, SEQ, WIDTH, LAYERS, HEADS = 1024, 64, 64, 2, 2

_generator = torch.Generator().manual_seed(0)
_stream = torch.randint(0, VOCAB, (600 * (SEQ + 1),), generator=_generator).view(600, SEQ + 1)
TRAIN = TensorDataset(_stream[:512, :-1], _stream[:512, 1:])
VAL = TensorDataset(_stream[512:, :-1], _stream[512:, 1:])


class TiedLM(L.LightningModule):
    def __init__(self, lr: float = 3e-3, warmup: int = 5) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embedding = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.zeros(1, SEQ, WIDTH))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.1, batch_first=True, norm_first=True)
            for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.decoder = nn.Linear(WIDTH, VOCAB, bias=False)
        self.decoder.weight = self.embedding.weight  # tied: one Parameter in two modules
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens) + self.position[:, :tokens.size(1)]
        mask = self.mask[:tokens.size(1), :tokens.size(1)]
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.decoder(self.norm(x))

    def training_step(self, batch, batch_idx):
        tokens, target = batch
        logits = self(tokens)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), target.reshape(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        tokens, target = batch
        loss = F.cross_entropy(self(tokens).reshape(-1, VOCAB).float(), target.reshape(-1))
        self.log("val_loss", loss, prog_bar=True)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)
        warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / self.hparams.warmup))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}


@autofit(global_batch=32, default_batch_size=16)  # autofit
def main(run):  # autofit
    L.seed_everything(42)
    model = TiedLM()
    train_loader = DataLoader(TRAIN, batch_size=run.batch_size, shuffle=True)  # autofit: was batch_size=16
    val_loader = DataLoader(VAL, batch_size=32)
    root = os.environ.get("PL_OUT", "lightning_logs_tied")
    trainer = AutofitLightningTrainer(  # autofit: was L.Trainer(
        run,  # autofit
        max_epochs=1, accumulate_grad_batches=2, gradient_clip_val=1.0, precision="32-true",
        logger=False, enable_progress_bar=False, default_root_dir=root, enable_checkpointing=False,
    )
    trainer.fit(model, train_loader, val_loader)
    trainer.save_checkpoint(os.path.join(root, "tied.ckpt"))
    assert model.decoder.weight is model.embedding.weight  # still tied after training
    print(f"lightning_tied: precision {trainer.precision} accumulation {trainer.accumulate_grad_batches} "
          f"micro-batch {train_loader.batch_size} steps {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
