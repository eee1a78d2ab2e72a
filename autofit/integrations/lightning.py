"""Lightning `Trainer`: the search's config applied to the Trainer's own settings (precision,
accumulate_grad_batches), the LightningModule's real training step probed in autofit's worker.

    from autofit import autofit
    from autofit.integrations.lightning import AutofitLightningTrainer

    @autofit(global_batch=64)
    def train(run):
        loader = DataLoader(dataset, batch_size=run.batch_size)     # the micro-batch
        trainer = AutofitLightningTrainer(run, max_epochs=3)        # was: L.Trainer(max_epochs=3)
        trainer.fit(model, loader)

Needs `pip install autofit[lightning]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch

from autofit.config import Config
from autofit.integrations._blocks import checkpointable_blocks
from autofit.run import Run, count_samples

#: autofit's precision names in Lightning's words.
PRECISION = {"fp32": "32-true", "tf32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
_FROM_LIGHTNING = {"32-true": "fp32", "32": "fp32", "bf16-mixed": "bf16", "16-mixed": "fp16"}


def trainer_settings(run: Run, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The Trainer's keyword arguments under the run's config; in a probe, without validation,
    checkpoints, loggers or progress bars, and with no epoch limit (the probe ends by itself). With no
    searched config (`run.defaults`) the user's precision and accumulation become the run's config."""
    settings = dict(kwargs)
    if run.defaults and not run.probing:  # nothing searched yet: the user's precision and accumulation stand
        precision = _FROM_LIGHTNING.get(str(settings.get("precision", "32-true")), "fp32")
        run.config = Config(run.batch_size, precision, accumulation_steps=int(settings.get("accumulate_grad_batches", 1)))
    settings["precision"] = PRECISION[run.precision]  # tf32: TF32 is set for the whole run by autofit
    settings["accumulate_grad_batches"] = run.accumulation_steps
    if run.device.type == "cpu":
        settings["accelerator"], settings["devices"] = "cpu", 1
    else:
        settings["accelerator"], settings["devices"] = "gpu", [run.device.index or 0]
    if run.probing:
        settings.update(max_epochs=-1, max_steps=-1, max_time=None, limit_val_batches=0, num_sanity_val_steps=0,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    return settings


class _StepCounter(pl.Callback):
    """Counts the Trainer's optimizer steps and their samples on the Run."""

    def __init__(self, run: Run) -> None:
        self._run, self.blocks = run, 0
        self._samples = 0
        self._steps_seen = 0

    def on_train_start(self, trainer, pl_module):
        self._steps_seen = trainer.global_step
        self._run.adopt_loop(checkpoint_blocks=self.blocks)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._samples += count_samples(batch)
        if trainer.global_step > self._steps_seen:  # this micro-batch ended an optimizer step
            self._steps_seen = trainer.global_step
            samples, self._samples = self._samples, 0
            self._run.step_taken(samples)


class AutofitLightningTrainer(pl.Trainer):
    """A `lightning.pytorch.Trainer` that trains under the run's config: precision, accumulation
    (give `run.batch_size` to your DataLoader: micro-batch x accumulation is the global batch), and
    PyTorch's activation checkpointing on the first `run.checkpoint_segments` of the module's
    repeated blocks (its longest ModuleList of one type, or `checkpoint_blocks`)."""

    def __init__(self, run: Run, *, checkpoint_blocks: Sequence[torch.nn.Module] | None = None,
                 **kwargs: Any) -> None:
        self._autofit_run = run
        self._autofit_blocks = checkpoint_blocks
        self._autofit_counter = _StepCounter(run)
        settings = trainer_settings(run, kwargs)
        settings["callbacks"] = [*(settings.get("callbacks") or []), self._autofit_counter]
        super().__init__(**settings)

    def fit(self, model: pl.LightningModule, *args: Any, **kwargs: Any) -> None:
        blocks = self._autofit_blocks if self._autofit_blocks is not None else checkpointable_blocks(model)
        self._autofit_counter.blocks = len(blocks)
        if self._autofit_run.checkpoint_segments and blocks:
            self._autofit_run.checkpoint(blocks)
        return super().fit(model, *args, **kwargs)
