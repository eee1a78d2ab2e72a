"""`Run`: what a training function sees. It carries one config and counts what the function does.

The face a training function uses (its settings, `autocast`, `backward`, `batches`, the knobs it offers,
its data: `RunView`, `RunData`); what autofit does with the run is `run.control` (a `RunControl`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from autofit.config import Config
from autofit.runtime._control import RunControl
from autofit.runtime._feed import OomGuard
from autofit.runtime._precision import precision_context
from autofit.runtime._redo import Lowering
from autofit.runtime._run_data import RunData
from autofit.runtime._settings import RunSettings
from autofit.runtime._tokens import TokenLoader
from autofit.runtime._view import RunView


class Run(RunView, RunData):
    """One training run under one `Config`: a probe of a few steps, or the real thing.

    Built from one `RunSettings`; `Run(config, device, **fields)` is short for
    `Run(RunSettings(config, device, **fields))`. A real run with `recover_oom` survives a step that
    runs out of memory: after the first optimizer step it redoes the step in place with a smaller
    micro-batch; before it, there is nothing to keep, and the normal call starts the function again.
    `run.control` (a RunControl) is autofit's own: a training function never needs it.
    """

    def __init__(self, settings: RunSettings | Config, device: torch.device | str | None = None,
                 **fields: Any) -> None:
        if isinstance(settings, Config):
            settings = RunSettings(settings, **fields) if device is None else RunSettings(settings, device, **fields)
        elif device is not None or fields:
            raise TypeError("Run(settings) takes no other arguments: put them in the RunSettings")
        self.defaults = settings.defaults
        """True when no best-config file was found: `config` is the decorator's default, not a
        measured answer (a framework integration then leaves the user's own settings alone)."""
        self.control = RunControl(settings)
        """autofit's own handle on this run, made here and nowhere else: its parts are given it, not the Run."""

    # --- what the run did ---------------------------------------------------------------------
    @property
    def token_loader(self) -> TokenLoader | None:
        """The loader run.token_batches() built last (its batches' padding share goes in the summary)."""
        return self.control.token_loader

    @property
    def lowerings(self) -> list[Lowering]:
        """The configs this run (and the attempts before it) lowered to after an OOM, oldest first."""
        return self.control.redo.lowerings

    @property
    def recovers_oom(self) -> bool:
        """True in a real run that survives an out-of-memory step by lowering its micro-batch."""
        return self.control.loop_redo.recovering

    @property
    def optimizer_steps(self) -> int:
        return self.control.clock.steps_done

    @property
    def micro_step(self) -> int:
        """Index of the micro-batch just handed out within its optimizer step (0 = a step begins; each
        piece of a micro-batch the token guard split counts, so it is 0 once per step).

        A step redone after an out-of-memory begins again at 0 with the same data: reset whatever
        you sum per step (losses, counts) when this is 0, and nothing is counted twice."""
        return max(0, self.control.feed.handed_in_step - 1)

    # --- the step -----------------------------------------------------------------------------
    def autocast(self):
        """Context for the forward pass under the chosen precision (fp32: nothing changes).

        In a real run it also catches an out-of-memory in the forward pass: the step is redone
        with a smaller micro-batch (the code between this block and `run.backward()` then runs once
        more with its previous values; `run.backward()` ignores that loss), and holds what the forward saves
        for backward where the redo can let it go; a probe of such a run saves the same way (and redoes nothing)."""
        self.control.knobs.autocast = True
        context = precision_context(self.config.precision, self.device)
        holds_saved = self.recovers_oom or self.control.settings.holds_saved  # a probe runs what its normal run runs
        return OomGuard(self.control.feed, context, "forward") if holds_saved else context

    def backward(
        self, loss: torch.Tensor, optimizer: torch.optim.Optimizer, *, clip_grad_norm: float | None = None
    ) -> None:
        """Backward with accumulation and fp16 loss scaling; steps and zeroes at step boundaries.

        `clip_grad_norm`: clip the gradients' total norm before each optimizer step (after fp16
        unscaling, over all micro-batches of the step), as `torch.nn.utils.clip_grad_norm_` would.
        """
        self.control.feed.backward(loss, optimizer, clip_grad_norm)

    def batches(self, iterable: Iterable[Any], *, tokens: int | Callable[[Any], int] | None = None,
                weight_by_tokens: bool = False) -> Iterator[Any]:
        """Yield micro-batches moved to the device; count samples, tokens and optimizer steps (a probe's
        loop ends via ProbeFinished once it has its steps). `tokens`: per sample (an int) or a function
        of the batch. `weight_by_tokens`: `run.backward` weighs each micro-batch's loss (a mean over its
        tokens) by its tokens: the step's gradients are then one big batch's token mean."""
        return self.control.feed.batches(iterable, tokens, weight_by_tokens)

    # --- the knobs ----------------------------------------------------------------------------
    def distribute(self, model: torch.nn.Module, *, blocks: Sequence[torch.nn.Module] | None = None,
                   shard: Sequence[torch.nn.Module] | None = None, offload: bool = False) -> torch.nn.Module:
        """`model` on this run's device; under torchrun, data-parallel across the ranks after checking
        that every rank trains with the same config (the process group joined if the function has
        not: gloo on CPU, NCCL on CUDA).

        With `blocks` (the model's repeated blocks), the config's `sharding` decides, and a search
        tries each: DistributedDataParallel ("ddp"); FSDP2 ("fsdp": `fully_shard` on each block,
        then the root; parameters, gradients and optimizer state split across ranks); the same kept
        on the CPU between uses ("fsdp-offload"). Without `blocks`, DDP. `shard` (blocks) forces
        FSDP2 whatever the config (`offload=True` adds the CPU offload). Apply checkpointing before;
        build the optimizer from the result's parameters."""
        return self.control.panel.distribute(self.config, model, blocks=blocks, shard=shard, offload=offload)

    def compile(self, model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
        """`torch.compile(model, **kwargs)` when the config says so, else `model` as it is: offering
        the model here lets a search probe compiled and eager as separate strategies (the compile
        time is reported apart, never counted in a probe's throughput)."""
        return self.control.panel.compile(self.config, model, **kwargs)

    def checkpoint(self, blocks: Sequence[torch.nn.Module]) -> Sequence[torch.nn.Module]:
        """Activation checkpointing on the first `checkpoint_segments` of `blocks`, and on none of
        the others (a model built once, at import, meets several configs in one process), under the
        config's `checkpoint_policy`: "full" recomputes each block's forward in backward, "selective"
        all of it but the matmul, convolution and attention outputs, which it keeps.

        Uses PyTorch's non-reentrant checkpoint; the modules keep their names and state-dict keys.
        """
        blocks = self.control.panel.checkpoint(self.config, blocks)
        self.control.hooks.blocks_offered(blocks)
        return blocks

    def channels_last(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` (a convolution model) in channels-last memory format when the config says so, else as it
        is: offering it here lets a search try the format on its fastest config. Back as it came at the end."""
        return self.control.panel.channels_last(self.config, model)

    def finish(self) -> None:
        """Close the last step when the function left its loop early (a `break`)."""
        self.control.feed.finish()
