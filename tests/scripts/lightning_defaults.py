"""The corpus' tied-weight Lightning LM (tests/corpus/lightning_tied.py) under a Trainer left at Lightning's
defaults, as its own examples leave it: the progress bar (a TQDM bar updated every step), the model summary and
the sanity check on, no `logger=False`. A probe keeps what a normal run does in and before its steps (the bar,
the summary, the sanity check) and leaves out what would write into the user's folders (the logger, checkpoints);
this case measures whether its figure is still the normal run's (issue 52, item 11). Logs go under $PL_OUT."""

from __future__ import annotations

import os
import runpy
import tempfile

import lightning.pytorch as L
import torch
from torch.utils.data import DataLoader

from autofit import autofit
from autofit.integrations.lightning import AutofitLightningTrainer

_TIED = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus", "lightning_tied.py"))
TiedLM, TRAIN, VAL = _TIED["TiedLM"], _TIED["TRAIN"], _TIED["VAL"]


@autofit(global_batch=32, default_batch_size=16)
def main(run):
    L.seed_everything(42)
    model = TiedLM()
    train_loader = DataLoader(TRAIN, batch_size=run.batch_size, shuffle=True)
    val_loader = DataLoader(VAL, batch_size=32)
    root = os.environ.get("PL_OUT") or tempfile.mkdtemp(prefix="lightning_defaults-")
    trainer = AutofitLightningTrainer(run, max_epochs=1, accumulate_grad_batches=2, gradient_clip_val=1.0,
                                      default_root_dir=root)
    trainer.fit(model, train_loader, val_loader)
    assert isinstance(model.decoder.weight, torch.nn.Parameter)


if __name__ == "__main__":
    main()
