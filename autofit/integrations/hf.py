"""Hugging Face `Trainer`: the search's config applied to `TrainingArguments`, the Trainer's own
training step probed in autofit's worker.

    from autofit import autofit
    from autofit.integrations.hf import AutofitTrainer

    @autofit(global_batch=32)
    def train(run):
        ...
        trainer = AutofitTrainer(run, model=model, args=args, train_dataset=dataset)
        trainer.train()

Arguments that group by length (`train_sampling_strategy="group_by_length"`, or `group_by_length=True`
before transformers 5) batch by tokens under a searched config: the training DataLoader's batch sampler is
`run.token_batches`' over the same lengths (`length_column_name`, else each sample's `input_ids`), and a
search climbs `max_tokens`. Other samplers batch by samples (`per_device_train_batch_size`), as before.

Needs `pip install 'torch-autofit[hf]'` (in a checkout: `pip install -e '.[hf]'`) (transformers, accelerate).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback, TrainingArguments

from autofit.config import Config
from autofit.errors import UsageError
from autofit.integrations._blocks import checkpointable_blocks
from autofit.integrations._tokens import CountedTokenBatches, unshard_token_batches
from autofit.runtime import PieceReplay, Run


def arguments_for(run: Run, args: TrainingArguments) -> TrainingArguments:
    """`args` with the run's micro-batch, accumulation and precision; in a probe, without the
    evaluation in its steps, saving and reporting (its logging and progress bar stay). With no searched config
    (`run.defaults`) the arguments stand and the run's config is set from them, so its report is true."""
    if run.defaults and not run.probing:  # nothing searched yet: the user's own settings stand
        precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
        run.control.set_config(Config(batch_size=args.per_device_train_batch_size, precision=precision,
                                      accumulation_steps=args.gradient_accumulation_steps))
        return args
    if run.config.max_tokens is not None:  # no global batch by tokens: the Trainer's accumulation stands
        run.control.set_config(dataclasses.replace(run.config, accumulation_steps=args.gradient_accumulation_steps))
    _check_global_batch(run.control.priced_config, args)  # a probe runs fewer micro-batches a step than it prices
    config = run.config
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
        # Logging (every `logging_steps`: a loss read from the device, a line printed) and the progress bar (updated
        # at every step) stay as the user's: the normal run pays for them in its steps. Reporting (TensorBoard,
        # W&B), saving and evaluation would write into the user's folders or accounts, or stop the steps.
        changes.update(eval_strategy="no", save_strategy="no", report_to="none", max_steps=10**9,
                       load_best_model_at_end=False)
    return dataclasses.replace(args, **changes)


def groups_by_length(args: TrainingArguments) -> bool:
    """Whether the arguments ask for HF's LengthGroupedSampler (transformers 5's strategy, or 4's flag)."""
    return getattr(args, "train_sampling_strategy", None) == "group_by_length" or bool(
        getattr(args, "group_by_length", False))


def _check_global_batch(config: Config, args: TrainingArguments) -> None:
    """Arguments that accumulate gradients ask for a global batch: never change it silently."""
    wanted = args.per_device_train_batch_size * args.gradient_accumulation_steps
    if args.gradient_accumulation_steps > 1 and config.max_tokens is None and config.global_batch != wanted:
        raise ValueError(
            f"The TrainingArguments ask for a global batch of {wanted} ({args.per_device_train_batch_size} x "
            f"{args.gradient_accumulation_steps} accumulation steps) but this config trains {config.label()} "
            f"(global batch {config.global_batch}): search with --global-batch {wanted} "
            f"(or @autofit(global_batch={wanted})) to keep it.")


class _StepCounter(TrainerCallback):
    """Counts the Trainer's optimizer steps on the Run: the clock a probe and a real run share."""

    def __init__(self, run: Run, blocks: int, replay: PieceReplay | None, counted: Any) -> None:
        self._run, self._blocks, self._replay = run, blocks, replay
        self._counted = counted  # the step's (samples, tokens) where the trainer counts them (token batches)

    def on_train_begin(self, args, state, control, **kwargs):
        self._run.control.adopt_loop(checkpoint_blocks=self._blocks)

    def on_step_end(self, args, state, control, **kwargs):
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * max(1, args.world_size)
        samples, tokens = self._counted() or (per_step, 0)
        if self._replay is not None:
            self._replay.step_done()
        self._run.control.step_taken(samples, tokens)


class AutofitTrainer(Trainer):
    """A `transformers.Trainer` that trains under the run's config: micro-batch, accumulation
    (the global batch held), precision, and PyTorch's activation checkpointing on the first
    `run.checkpoint_segments` of the model's repeated layers (or of `checkpoint_blocks`). Arguments that
    group by length batch by tokens (`run.token_sampler` over the same lengths) under a searched config;
    with no searched config (`run.defaults`) HF's own sampler stands."""

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
        self._autofit_replay = PieceReplay(run.control, self._zero_grad) if run.recovers_oom else None
        self._autofit_weight = 1.0  # a piece's share of its micro-batch's loss (after an OOM)
        self._autofit_run = run
        self._autofit_batches: CountedTokenBatches | None = None  # the token batches being trained on
        self._autofit_step = [0, 0]  # samples and real tokens of the optimizer step being fed (token batches)
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []),
                               _StepCounter(run, len(blocks), self._autofit_replay, self._autofit_step_count)]
        super().__init__(**kwargs)
        self.data_collator = _padding_to_the_multiple(self.data_collator, run)

    def get_train_dataloader(self) -> DataLoader:
        """HF's, or where the arguments group by length under a searched config, the same data batched by
        tokens: collation (unused columns removed), workers and pinning as HF's, prepared by Accelerate."""
        run = self._autofit_run
        if not groups_by_length(self.args) or (run.defaults and not run.probing) or self.train_dataset is None:
            return super().get_train_dataloader()
        if run.control.settings.global_tokens is not None:
            raise UsageError("The Trainer's gradient_accumulation_steps set its optimizer step: batching by tokens "
                             "under the Trainer, search without global_tokens.")
        lengths = self._autofit_lengths()
        sampler = run.token_sampler(lengths, seed=self.args.data_seed if self.args.data_seed is not None else self.args.seed)
        self._autofit_batches = CountedTokenBatches(sampler)
        dataset, collator = self.train_dataset, self.data_collator
        if hasattr(dataset, "column_names"):  # a datasets.Dataset
            dataset = self._remove_unused_columns(dataset, description="Training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="Training")
        loader = DataLoader(dataset, batch_sampler=self._autofit_batches, collate_fn=collator,
                            **_hf_loader_arguments(self.args))
        return unshard_token_batches(self.accelerator.prepare(loader))

    def _autofit_lengths(self) -> list[int]:
        """Each training sample's length, as HF's LengthGroupedSampler takes it (`length_column_name`, else
        the model's first input)."""
        takes_dataset = "train_dataset" in inspect.signature(super()._get_train_sampler).parameters
        grouped = super()._get_train_sampler(self.train_dataset) if takes_dataset else super()._get_train_sampler()
        lengths = getattr(grouped, "lengths", None)
        if lengths is None:
            raise UsageError(f"Batching by tokens needs each sample's length, as group_by_length does, but the "
                             f"Trainer's sampler is a {type(grouped).__name__}.")
        return [int(n) for n in lengths]

    def _autofit_step_count(self) -> tuple[int, int] | None:
        """The samples and real tokens of the optimizer step just taken (token batches), counted afresh."""
        if self._autofit_batches is None:
            return None
        samples, tokens = self._autofit_step
        self._autofit_step[:] = [0, 0]
        return samples, tokens

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        if self._autofit_batches is not None:  # the micro-batch's samples and real tokens, as its sampler cut it
            samples, tokens = self._autofit_batches.take()
            self._autofit_step[0] += samples
            self._autofit_step[1] += tokens
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


def _padding_to_the_multiple(collator: Any, run: Run) -> Any:
    """A collator that pads (`pad_to_multiple_of`: DataCollatorWithPadding's, for language modelling's) offers the
    pad multiple (`run.pad_multiple`): a copy of it pads to the config's where a config sets one; the user's own
    setting stands otherwise."""
    if collator is None or not hasattr(collator, "pad_to_multiple_of"):
        return collator
    multiple = run.pad_multiple  # read: the search may try one
    if run.config.pad_multiple is None:
        return collator
    if dataclasses.is_dataclass(collator) and not isinstance(collator, type):
        return dataclasses.replace(collator, pad_to_multiple_of=multiple)
    padded = copy.copy(collator)
    padded.pad_to_multiple_of = multiple
    return padded


def _hf_loader_arguments(args: Any) -> dict[str, Any]:
    """The DataLoader arguments HF's Trainer gives its training loader (workers, pinning, prefetch, persistent
    workers, multiprocessing context, its seeded workers), each where this transformers has it: the token
    batches load as HF's own loader would."""
    workers = args.dataloader_num_workers
    out: dict[str, Any] = {"num_workers": workers, "pin_memory": args.dataloader_pin_memory}
    if workers > 0:
        out.update(prefetch_factor=args.dataloader_prefetch_factor,
                   persistent_workers=args.dataloader_persistent_workers)
        context = getattr(args, "dataloader_multiprocessing_context", None)
        if context is not None:
            out["multiprocessing_context"] = context
        try:
            from transformers.trainer_utils import seed_worker
        except ImportError:
            seed_worker = None
        if seed_worker is not None:
            named = inspect.signature(seed_worker).parameters
            out["worker_init_fn"] = (partial(seed_worker, num_workers=workers, rank=args.process_index)
                                     if "rank" in named else seed_worker)
    in_order = getattr(args, "dataloader_in_order", None)
    if in_order is not None and "in_order" in inspect.signature(DataLoader).parameters:
        out["in_order"] = in_order
    return out
