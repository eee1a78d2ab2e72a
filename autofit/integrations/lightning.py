"""Lightning `Trainer`: the search's config applied to the Trainer's own settings (precision,
accumulate_grad_batches), the LightningModule's real training step probed in autofit's worker.

    from autofit import autofit
    from autofit.integrations.lightning import AutofitLightningTrainer

    @autofit(global_batch=64)
    def train(run):
        loader = DataLoader(dataset, batch_size=run.batch_size)     # the micro-batch
        trainer = AutofitLightningTrainer(run, max_epochs=3)        # was: L.Trainer(max_epochs=3)
        trainer.fit(model, loader)

Needs `pip install 'torch-autofit[lightning]'` (in a checkout: `pip install -e '.[lightning]'`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch

from autofit.config import Config
from autofit.integrations._blocks import checkpointable_blocks
from autofit.runtime import PieceReplay, Run, count_samples

#: autofit's precision names in Lightning's words.
PRECISION = {"fp32": "32-true", "tf32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
_FROM_LIGHTNING = {"32-true": "fp32", "32": "fp32", "bf16-mixed": "bf16", "16-mixed": "fp16"}
#: A probe's validation interval, in training micro-batches: never reached.
_NEVER = 2**62


def trainer_settings(run: Run, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The Trainer's keyword arguments under the run's config; in a probe, without validation in its steps
    (its sanity check, progress bar and model summary stay), checkpoints or loggers, and with no epoch limit
    (the probe ends by itself). With no searched config (`run.defaults`) the user's precision and
    accumulation become the run's config."""
    settings = dict(kwargs)
    if run.defaults and not run.probing:  # nothing searched yet: the user's precision and accumulation stand
        precision = _FROM_LIGHTNING.get(str(settings.get("precision", "32-true")), "fp32")
        declared = run.config.global_batch
        run.control.set_config(Config(batch_size=run.batch_size, precision=precision,
                                      accumulation_steps=int(settings.get("accumulate_grad_batches", 1))))
        if run.config.global_batch != declared and run.is_main:
            # The loader was built with run.batch_size before the Trainer: only the user can keep both.
            print(f"autofit: the Trainer accumulates {run.accumulation_steps} micro-batches of {run.batch_size}, so "
                  f"this run's global batch is {run.config.global_batch}, not the {declared} @autofit declares: "
                  f"give @autofit default_batch_size={max(1, declared // run.accumulation_steps)} (or leave out the "
                  f"Trainer's accumulate_grad_batches) to train {declared} before a search", file=sys.stderr)
    settings["precision"] = PRECISION[run.precision]  # tf32: TF32 is set for the whole run by autofit
    settings["accumulate_grad_batches"] = run.accumulation_steps
    if run.device.type == "cpu":
        settings["accelerator"], settings["devices"] = "cpu", 1
    else:
        settings["accelerator"], settings["devices"] = "gpu", [run.device.index or 0]
    if run.probing:
        # Validation never comes in a probe's steps (`check_val_every_n_epoch=None` and a step interval never
        # reached), but the sanity check before them runs as the user's Trainer has it (its
        # `num_sanity_val_steps`, `limit_val_batches`): what a run does before its steps is where glibc's
        # allocator sets its dynamic mmap threshold, and so how often its steps fault pages in (a tied LM whose
        # sanity check was left out: 4 MiB against 8 MiB, and its probe read 0.96 of its normal run).
        # The progress bar and the model summary stay as the user's Trainer has them: the bar's update is part
        # of every step the normal run takes, and the summary runs before them (a forward pass, with an
        # `example_input_array`); both only print, into the probe's log. Loggers and checkpoints would write
        # into the user's folders, and come every `log_every_n_steps` (50) or at an epoch's end at the earliest.
        settings.update(max_epochs=-1, max_steps=-1, max_time=None, check_val_every_n_epoch=None,
                        val_check_interval=_NEVER, logger=False, enable_checkpointing=False)
    return settings


class _StepCounter(pl.Callback):
    """Counts the Trainer's optimizer steps and their samples on the Run."""

    def __init__(self, run: Run) -> None:
        self._run, self.blocks = run, 0
        self.replay: PieceReplay | None = None
        self._samples = 0
        self._steps_seen = 0

    def on_train_start(self, trainer, pl_module):
        self._steps_seen = trainer.global_step
        self._run.control.adopt_loop(checkpoint_blocks=self.blocks)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._samples += count_samples(batch)
        if trainer.global_step > self._steps_seen:  # this micro-batch ended an optimizer step
            self._steps_seen = trainer.global_step
            samples, self._samples = self._samples, 0
            if self.replay is not None:
                self.replay.step_done()
            self._run.control.step_taken(samples)


class AutofitLightningTrainer(pl.Trainer):
    """A `lightning.pytorch.Trainer` that trains under the run's config: precision, accumulation
    (give `run.batch_size` to your DataLoader: micro-batch x accumulation is the global batch), and
    PyTorch's activation checkpointing on the first `run.checkpoint_segments` of the module's
    repeated blocks (its longest ModuleList of one type, or `checkpoint_blocks`).

    In a real run with automatic optimization, a training step that runs out of memory is run again
    with the micro-batch cut in pieces (autofit.runtime.PieceReplay): the loader, the accumulation
    and the global batch stay as they are. An OOM in the optimizer's own step is not caught."""

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
        if blocks:
            self._autofit_run.checkpoint(blocks)  # at 0 segments too: no block keeps another run's checkpointing
        if self._autofit_run.recovers_oom and model.automatic_optimization:
            self._autofit_counter.replay = _recover_in(self, self._autofit_run, model)
        return super().fit(model, *args, **kwargs)


def _recover_in(trainer: pl.Trainer, run: Run, module: pl.LightningModule) -> PieceReplay:
    """Wrap the trainer's strategy so its training step survives an OOM (automatic optimization:
    Lightning runs `strategy.training_step`, then `strategy.backward` on its loss, per micro-batch).

    Once lowered, `training_step` runs the first piece of the micro-batch and hands its weighted loss
    to Lightning, whose backward then runs the other pieces, forward and backward, one at a time."""
    replay = PieceReplay(run.control, lambda: module.zero_grad(set_to_none=True))
    strategy = trainer.strategy
    training_step, backward = strategy.training_step, strategy.backward
    current: dict[str, Any] = {}

    def whole_piece(piece: Any, weight: float, context: tuple) -> None:
        rest, kwargs, optimizer = context
        # Lightning divides the loss by the accumulation before its backward: so do the pieces.
        replay.whole_piece(piece, weight, lambda p: training_step(p, *rest, **kwargs),
                           lambda loss: backward(loss / trainer.accumulate_grad_batches, optimizer))

    def recovering_training_step(batch: Any, *rest: Any, **kwargs: Any) -> Any:
        current.update(batch=batch, rest=rest, kwargs=kwargs)
        return replay.first_piece(batch, lambda piece: training_step(piece, *rest, **kwargs), whole_piece)

    def recovering_backward(loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        batch, context = current["batch"], (current["rest"], current["kwargs"], optimizer)
        replay.backward_and_rest(batch, context, loss, lambda: backward(loss, optimizer, *args, **kwargs),
                                 whole_piece)
        return None  # Lightning's backward_fn ignores what the strategy's backward returns

    strategy.training_step, strategy.backward = recovering_training_step, recovering_backward
    return replay
