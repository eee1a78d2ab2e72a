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
from autofit.run import Run


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

    def __init__(self, run: Run, blocks: int) -> None:
        self._run, self._blocks = run, blocks

    def on_train_begin(self, args, state, control, **kwargs):
        self._run.adopt_loop(checkpoint_blocks=self._blocks)

    def on_step_end(self, args, state, control, **kwargs):
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * max(1, args.world_size)
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
        if run.checkpoint_segments and blocks:
            run.checkpoint(blocks)
            if getattr(getattr(model, "config", None), "use_cache", False):
                model.config.use_cache = False  # a cache filled twice by recomputation (as HF does it)
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), _StepCounter(run, len(blocks))]
        super().__init__(**kwargs)
