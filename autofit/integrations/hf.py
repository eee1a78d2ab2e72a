"""Hugging Face `Trainer`: the search's config applied to `TrainingArguments`, the Trainer's own
training step probed in autofit's worker.

    from autofit import autofit
    from autofit.integrations.hf import AutofitTrainer

    @autofit(global_batch=32)
    def train(run):
        ...
        trainer = AutofitTrainer(run, model=model, args=args, train_dataset=dataset)
        trainer.train()

Needs `pip install autofit[hf]` (transformers, accelerate).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from autofit.config import Config
from autofit.integrations._blocks import checkpointable_blocks
from autofit.runtime import PieceReplay, Run


def arguments_for(run: Run, args: TrainingArguments) -> TrainingArguments:
    """`args` with the run's micro-batch, accumulation and precision; in a probe, without the
    evaluation, saving, logging and reporting a probe does not need. With no searched config
    (`run.defaults`) the arguments stand and the run's config is set from them, so its report is true."""
    if run.defaults and not run.probing:  # nothing searched yet: the user's own settings stand
        precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
        run.config = Config(args.per_device_train_batch_size, precision,
                            accumulation_steps=args.gradient_accumulation_steps)
        return args
    config = run.config
    _check_global_batch(config, args)
    changes: dict[str, Any] = {
        "per_device_train_batch_size": config.batch_size,
        "gradient_accumulation_steps": config.accumulation_steps,
        "bf16": config.precision == "bf16",
        "fp16": config.precision == "fp16",
        "gradient_checkpointing": False,  # autofit checkpoints the first N blocks itself
        "auto_find_batch_size": False,
        "use_cpu": run.device.type == "cpu",
    }
    if run.device.type == "cuda":
        changes["tf32"] = config.precision == "tf32"
    if run.probing:
        changes.update(eval_strategy="no", save_strategy="no", logging_strategy="no", report_to="none",
                       disable_tqdm=True, max_steps=10**9, load_best_model_at_end=False)
    return dataclasses.replace(args, **changes)


def _check_global_batch(config: Config, args: TrainingArguments) -> None:
    """Arguments that accumulate gradients ask for a global batch: never change it silently."""
    wanted = args.per_device_train_batch_size * args.gradient_accumulation_steps
    if args.gradient_accumulation_steps > 1 and config.global_batch != wanted:
        raise ValueError(
            f"The TrainingArguments ask for a global batch of {wanted} ({args.per_device_train_batch_size} x "
            f"{args.gradient_accumulation_steps} accumulation steps) but this config trains {config.label()} "
            f"(global batch {config.global_batch}): search with --global-batch {wanted} "
            f"(or @autofit(global_batch={wanted})) to keep it.")


class _StepCounter(TrainerCallback):
    """Counts the Trainer's optimizer steps on the Run: the clock a probe and a real run share."""

    def __init__(self, run: Run, blocks: int, replay: PieceReplay | None) -> None:
        self._run, self._blocks, self._replay = run, blocks, replay

    def on_train_begin(self, args, state, control, **kwargs):
        self._run.adopt_loop(checkpoint_blocks=self._blocks)

    def on_step_end(self, args, state, control, **kwargs):
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * max(1, args.world_size)
        if self._replay is not None:
            self._replay.step_done()
        self._run.step_taken(per_step)


class AutofitTrainer(Trainer):
    """A `transformers.Trainer` that trains under the run's config: micro-batch, accumulation
    (the global batch held), precision, and PyTorch's activation checkpointing on the first
    `run.checkpoint_segments` of the model's repeated layers (or of `checkpoint_blocks`)."""

    def __init__(self, run: Run, *args: Any, checkpoint_blocks: Sequence[torch.nn.Module] | None = None,
                 **kwargs: Any) -> None:
        if args:
            raise TypeError("AutofitTrainer(run, model=..., args=..., ...): pass the Trainer's arguments by name")
        model = kwargs.get("model")
        training_args = kwargs.get("args") or TrainingArguments(output_dir="trainer_output")
        kwargs["args"] = arguments_for(run, training_args)
        blocks = checkpoint_blocks if checkpoint_blocks is not None else (
            checkpointable_blocks(model) if model is not None else ())
        if blocks:
            run.checkpoint(blocks)  # at 0 segments too: no block keeps another run's checkpointing
            if run.checkpoint_segments and getattr(getattr(model, "config", None), "use_cache", False):
                model.config.use_cache = False  # a cache filled twice by recomputation (as HF does it)
        self._autofit_replay = PieceReplay(run, self._zero_grad) if run.recovers_oom else None
        self._autofit_weight = 1.0  # a piece's share of its micro-batch's loss (after an OOM)
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), _StepCounter(run, len(blocks), self._autofit_replay)]
        super().__init__(**kwargs)

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        replay = self._autofit_replay
        if replay is None:
            return super().training_step(model, inputs, num_items_in_batch)

        def piece_step(piece: dict[str, Any], weight: float, items: Any) -> torch.Tensor:
            # A loss normalized by the step's item count (HF's own fix for accumulation) adds up over
            # pieces as it is; a mean over the piece is weighted by its share of the micro-batch.
            self._autofit_weight = 1.0 if self._loss_counts_items(items) else weight
            try:
                return super(AutofitTrainer, self).training_step(model, piece, items)
            finally:
                self._autofit_weight = 1.0

        return sum(replay.feed(inputs, num_items_in_batch, piece_step))

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        replay = self._autofit_replay
        if replay is not None:
            replay.where = "forward"
        result = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                      num_items_in_batch=num_items_in_batch)
        if replay is not None:
            replay.where = "backward"
        if self._autofit_weight != 1.0:
            result = (result[0] * self._autofit_weight, *result[1:]) if return_outputs else result * self._autofit_weight
        return result

    def _loss_counts_items(self, num_items_in_batch: Any) -> bool:
        """Whether the Trainer's loss is already divided by the step's item count (as in training_step)."""
        if getattr(self, "loss_is_scaled_for_ga", None) is not None:
            return bool(self.loss_is_scaled_for_ga)
        return bool(getattr(self, "model_accepts_loss_kwargs", False) and num_items_in_batch is not None) \
            or getattr(self, "compute_loss_func", None) is not None

    def _zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)
