"""Hugging Face Accelerate (the `no_trainer` scripts): the search's config applied to the
`Accelerator`'s own settings, the script's own loop probed in autofit's worker.

    from autofit import autofit
    from autofit.integrations.accelerate import AutofitAccelerator

    @autofit(global_batch=32)
    def train(run):
        accelerator = AutofitAccelerator(run, gradient_accumulation_steps=4)  # was: Accelerator(...)
        model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(...)
        for batch in train_dataloader:
            with accelerator.accumulate(model):
                ...

Token batches: build the training loader with `run.token_batches(dataset, lengths, collate_fn=...)` and
hand it to `prepare()` as any DataLoader; its batch sampler is kept (across processes too: every rank
already gets as many micro-batches), a search climbs `max_tokens`, and steps count their real tokens.

Needs `pip install 'torch-autofit[hf]'` (in a checkout: `pip install -e '.[hf]'`) (accelerate).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from torch.utils.data import DataLoader, IterableDataset, Sampler

from autofit.config import Config
from autofit.errors import UsageError
from autofit.integrations._blocks import checkpointable_blocks
from autofit.integrations._tokens import CountedTokenBatches, unshard_token_batches
from autofit.runtime import PieceReplay, Run, TokenBatchSampler, count_samples, loss_of

#: autofit's precision names in Accelerate's words (tf32: TF32 is held for the whole run by autofit).
PRECISION = {"fp32": "no", "tf32": "no", "bf16": "bf16", "fp16": "fp16"}
_FROM_ACCELERATE = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}


def accelerator_settings(run: Run, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The Accelerator's keyword arguments under the run's config: mixed precision and gradient
    accumulation; in a probe, without trackers. With no searched config (`run.defaults`) the user's
    own settings stand."""
    settings = dict(kwargs)
    if run.defaults and not run.probing:
        return settings
    settings["mixed_precision"] = PRECISION[run.precision]
    plugin = settings.get("gradient_accumulation_plugin")
    if plugin is not None:
        settings["gradient_accumulation_plugin"] = dataclasses.replace(plugin, num_steps=run.accumulation_steps)
    else:
        settings["gradient_accumulation_steps"] = run.accumulation_steps
    if run.device.type == "cpu":
        settings["cpu"] = True
    if run.probing:
        settings["log_with"] = None
    return settings


def _users_accumulation(kwargs: dict[str, Any]) -> int:
    plugin = kwargs.get("gradient_accumulation_plugin")
    return int(plugin.num_steps if plugin is not None else kwargs.get("gradient_accumulation_steps", 1))


class _Endless(Sampler):
    """A probe's sampler: the same order again and again, so a probe never runs out of data; its
    length is the original's, so the script's own step arithmetic stays as it is."""

    def __init__(self, sampler: Any) -> None:
        self._sampler = sampler

    def __iter__(self) -> Iterator[Any]:
        while True:
            yield from self._sampler

    def __len__(self) -> int:
        return len(self._sampler)


def rebatched(loader: DataLoader, batch_size: int, *, endless: bool = False) -> DataLoader:
    """`loader` built again at `batch_size`, with its own dataset, sampler (its order), collation and
    workers. `endless` (a probe): the sampler starts again at its end."""
    sampler = None if isinstance(loader.dataset, IterableDataset) else loader.sampler
    if endless and sampler is not None:
        sampler = _Endless(sampler)
    return rebuilt(loader, batch_size=batch_size, sampler=sampler, drop_last=loader.drop_last)


def rebuilt(loader: DataLoader, **batching: Any) -> DataLoader:
    """`loader` built again with other `batching` arguments (batch_size and sampler, or batch_sampler), with
    its own dataset, collation and workers."""
    extra: dict[str, Any] = {}
    if loader.num_workers > 0:
        extra.update(prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers)
    return DataLoader(loader.dataset, collate_fn=loader.collate_fn, num_workers=loader.num_workers,
                      pin_memory=loader.pin_memory, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                      generator=loader.generator, multiprocessing_context=loader.multiprocessing_context,
                      **batching, **extra)


class AutofitAccelerator(Accelerator):
    """An `accelerate.Accelerator` that trains under the run's config: mixed precision,
    gradient accumulation (the global batch held), the micro-batch (the first DataLoader handed to
    `prepare()`, the training one as HF's scripts order them, is built again at `run.batch_size`;
    the others are left as they are), and PyTorch's activation checkpointing on the first
    `run.checkpoint_segments` of the model's repeated blocks (or of `checkpoint_blocks`).

    Optimizer steps (of the first optimizer prepared) are counted on the run. In a real run, a
    training forward or `backward()` that runs out of memory is done again with the micro-batch cut
    in pieces (autofit.runtime.PieceReplay): this needs the loss the model returns (HF models
    given labels, or a dict with "loss"). An OOM in the optimizer's own step is not caught."""

    def __init__(self, run: Run, *args: Any, checkpoint_blocks: Sequence[torch.nn.Module] | None = None,
                 **kwargs: Any) -> None:
        if args:
            raise TypeError("AutofitAccelerator(run, mixed_precision=..., ...): pass the Accelerator's arguments by name")
        if run.world_size <= 1:
            # A probe worker may build one Accelerator per probe in one process: Accelerate keeps its
            # settings in process-wide singletons that refuse a second mixed precision.
            AcceleratorState._reset_state()
            GradientState._reset_state()
        self._autofit_run = run
        self._autofit_blocks = checkpoint_blocks
        self._autofit_block_count: int | None = None
        self._autofit_users_accumulation = _users_accumulation(kwargs)
        self._autofit_trains_loader = False  # the training DataLoader was prepared
        self._autofit_optimizer: Any = None  # the one whose steps are counted
        self._autofit_adopted = False  # the run's clock started
        self._autofit_accumulating = False  # accumulate() was entered
        self._autofit_samples = 0  # of the optimizer step being fed
        self._autofit_tokens = 0  # real tokens of the optimizer step being fed (token batches)
        self._autofit_batches: CountedTokenBatches | None = None  # the training loader's token batches
        self._autofit_replay = PieceReplay(run.control, self._autofit_zero_grad) if run.recovers_oom else None
        self._autofit_models: list[torch.nn.Module] = []
        self._autofit_batch: Any = None  # the last training forward's (args, kwargs), until its backward
        self._autofit_loss: Any = None  # the loss that forward returned
        self._autofit_forward: Any = None  # the model's forward under Accelerate, without autofit's wrapper
        super().__init__(**accelerator_settings(run, kwargs))

    # --- prepare: the config applied to what the script hands over ---------------------------------
    def prepare_data_loader(self, data_loader: DataLoader, device_placement: bool | None = None,
                            slice_fn_for_dispatch: Any = None) -> Any:
        if not self._autofit_trains_loader:
            self._autofit_trains_loader = True
            data_loader = self._autofit_training_loader(data_loader)
        return unshard_token_batches(super().prepare_data_loader(data_loader, device_placement=device_placement,
                                                                 slice_fn_for_dispatch=slice_fn_for_dispatch))

    def _autofit_training_loader(self, loader: DataLoader) -> DataLoader:
        run = self._autofit_run
        if isinstance(loader.batch_sampler, TokenBatchSampler):  # run.token_batches: its batches, counted
            self._autofit_batches = CountedTokenBatches(loader.batch_sampler, endless=run.probing)
            return rebuilt(loader, batch_sampler=self._autofit_batches)
        if loader.batch_size is None:  # a batch_sampler of the script's own: its batches stand
            print("autofit: the training DataLoader has its own batch_sampler; its batches are kept as they are",
                  file=sys.stderr, flush=True)
            return loader
        if run.defaults and not run.probing:  # the user's micro-batch, precision and accumulation stand
            run.control.set_config(Config(batch_size=loader.batch_size,
                                          precision=_FROM_ACCELERATE.get(self.mixed_precision, "fp32"),
                                          accumulation_steps=self.gradient_accumulation_steps))
            return loader
        self._autofit_check_global_batch(loader.batch_size)
        if loader.batch_size == run.batch_size and not run.probing:
            return loader
        return rebatched(loader, run.batch_size, endless=run.probing)

    def _autofit_check_global_batch(self, loader_batch: int) -> None:
        """A script that accumulates gradients asks for a global batch: never change it silently."""
        # a probe runs fewer micro-batches a step than it prices: the global batch is the priced config's
        config, accumulation = self._autofit_run.control.priced_config, self._autofit_users_accumulation
        wanted = loader_batch * accumulation
        if accumulation > 1 and config.global_batch != wanted:
            raise UsageError(
                f"The script asks for a global batch of {wanted} ({loader_batch} x {accumulation} accumulation "
                f"steps) but this config trains {config.label()} (global batch {config.global_batch}): search "
                f"with --global-batch {wanted} (or @autofit(global_batch={wanted})) to keep it.")

    def prepare_model(self, model: torch.nn.Module, device_placement: bool | None = None,
                      evaluation_mode: bool = False) -> Any:
        run = self._autofit_run
        if not evaluation_mode and self._autofit_block_count is None:
            blocks = self._autofit_blocks if self._autofit_blocks is not None else checkpointable_blocks(model)
            self._autofit_block_count = len(blocks)
            if blocks and not (run.defaults and not run.probing):
                run.checkpoint(blocks)  # at 0 segments too: no block keeps another run's checkpointing
                if run.checkpoint_segments and getattr(getattr(model, "config", None), "use_cache", False):
                    model.config.use_cache = False  # a cache filled twice by recomputation (as HF does it)
        prepared = super().prepare_model(model, device_placement=device_placement, evaluation_mode=evaluation_mode)
        if not evaluation_mode and not self._autofit_models:
            self._autofit_models.append(prepared)
            self._autofit_wrap_forward(prepared)
        return prepared

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None) -> Any:
        prepared = super().prepare_optimizer(optimizer, device_placement=device_placement)
        if self._autofit_optimizer is None:
            self._autofit_optimizer = prepared
            step = prepared.step

            @functools.wraps(step)
            def counted_step(*args: Any, **kwargs: Any) -> Any:
                result = step(*args, **kwargs)
                if self.sync_gradients:
                    self._autofit_step_taken()
                return result

            prepared.step = counted_step
        return prepared

    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        prepared = super().prepare(*args, device_placement=device_placement)
        self._autofit_adopt()
        return prepared

    def _autofit_adopt(self) -> None:
        """The loop is the script's: every knob counts, and the clock starts once the optimizer is ready."""
        if self._autofit_optimizer is not None and not self._autofit_adopted:
            self._autofit_adopted = True
            self._autofit_run.control.adopt_loop(checkpoint_blocks=self._autofit_block_count)

    # --- the loop: steps counted, OOMs redone -----------------------------------------------------
    def accumulate(self, *models: torch.nn.Module) -> Any:
        """Accelerate's own; autofit notes that the loop accumulates where Accelerate says."""
        self._autofit_accumulating = True
        return super().accumulate(*models)

    def _autofit_step_taken(self) -> None:
        run = self._autofit_run
        self._autofit_adopt()  # an optimizer prepared by prepare_optimizer() alone
        if run.accumulation_steps > 1 and not self._autofit_accumulating and self.gradient_accumulation_steps > 1:
            raise UsageError(
                f"This config accumulates {run.accumulation_steps} micro-batches per optimizer step, but the loop "
                "steps its optimizer outside `with accelerator.accumulate(model):`: put the step inside it.")
        samples = self._autofit_samples or run.batch_size * run.accumulation_steps
        tokens, self._autofit_samples, self._autofit_tokens = self._autofit_tokens, 0, 0
        if self._autofit_replay is not None:
            self._autofit_replay.step_done()
        run.control.step_taken(samples, tokens)

    def _autofit_wrap_forward(self, model: torch.nn.Module) -> None:
        """Count the training forwards' samples; in a real run, run them in pieces after an OOM."""
        forward = model.forward
        self._autofit_forward = forward

        @functools.wraps(forward)
        def autofit_forward(*args: Any, **kwargs: Any) -> Any:
            if not (model.training and torch.is_grad_enabled()):
                return forward(*args, **kwargs)
            batch = (args, kwargs)
            self._autofit_samples += count_samples(batch)
            if self._autofit_batches is not None:  # the micro-batch's real tokens, as its sampler cut it
                self._autofit_tokens += self._autofit_batches.take()[1]
            if self._autofit_replay is None:
                return forward(*args, **kwargs)
            return self._autofit_first_piece(batch)

        model.forward = autofit_forward

    def _autofit_first_piece(self, batch: tuple) -> Any:
        """The forward of the micro-batch's first piece (all of it until an OOM), its loss weighted by
        the piece's share; `backward()` then runs the other pieces."""
        output = self._autofit_replay.first_piece(batch, self._autofit_forward_of, self._autofit_whole_piece)
        self._autofit_batch, self._autofit_loss = batch, loss_of(output)
        return output

    def _autofit_forward_of(self, piece: tuple) -> Any:
        args, kwargs = piece
        return self._autofit_forward(*args, **kwargs)

    def _autofit_whole_piece(self, piece: tuple, weight: float, context: Any) -> None:
        """One piece of a micro-batch, forward and backward, its loss weighted by its share."""
        self._autofit_replay.whole_piece(piece, weight, self._autofit_forward_of, super().backward)

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        replay, batch = self._autofit_replay, self._autofit_batch
        if replay is None or batch is None:
            return super().backward(loss, **kwargs)
        self._autofit_batch = None
        if loss is not self._autofit_loss:
            if len(replay.pieces(batch)) > 1:
                raise UsageError(
                    "After an out-of-memory the micro-batch is run in pieces, which needs the loss the "
                    "model returns, given to accelerator.backward() as it is (`loss = outputs.loss`); this loop "
                    "computes its own. Use a micro-batch that fits, or AUTOFIT_OOM_RECOVERY=0.")
            return super().backward(loss, **kwargs)  # not the model's loss: no redo for this step
        # `loss` is the script's: it cannot be computed again, so an OOM redoes the step so far.
        replay.backward_and_rest(batch, None, loss, lambda: super(AutofitAccelerator, self).backward(loss, **kwargs),
                                 self._autofit_whole_piece)
        return None

    def _autofit_zero_grad(self) -> None:
        for model in self._autofit_models:
            model.zero_grad(set_to_none=True)

