"""`Run`: what a training function sees. It carries one config and counts what the function does.

A thin face over its parts, each owning one concern: the step clock (`StepClock`), the steps its own
loop builds (`StepFeed`), the knobs it offers (`KnobPanel`), the OOM redo (`LoopRedo` over the one
`StepRedo`) and what it measured (`run_summary`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from autofit.config import Config
from autofit.runtime._accumulation import InnerSpans, watch_backward
from autofit.runtime._clock import ProbeFinished, StepClock
from autofit.runtime._distributed import Ranks, agree_on_most
from autofit.runtime._feed import OomGuard, StepFeed
from autofit.runtime._flops import StepFlops
from autofit.runtime._follow import StepFollower
from autofit.runtime._knobs import KnobPanel, Knobs
from autofit.runtime._precision import forces_tf32, precision_context, precision_scope
from autofit.runtime._redo import LoopRedo, Lowering, StepRedo
from autofit.runtime._report import run_summary
from autofit.runtime._run_data import RunData
from autofit.runtime._settings import RunSettings
from autofit.runtime._tokens import TokenLoader
from autofit.runtime._view import RunView


class Run(RunView, RunData):
    """One training run under one `Config`: a probe of a few steps, or the real thing.

    Built from one `RunSettings`; `Run(config, device, **fields)` is short for
    `Run(RunSettings(config, device, **fields))`. A real run with `recover_oom` survives a step that
    runs out of memory (its `redo`, a StepRedo): after the first optimizer step it redoes the step in
    place with a smaller micro-batch; before it, there is nothing to keep, and `restart_lowering` tells
    the normal call what to start again with.
    """

    def __init__(self, settings: RunSettings | Config, device: torch.device | str | None = None,
                 **fields: Any) -> None:
        if isinstance(settings, Config):
            settings = RunSettings(settings, **fields) if device is None else RunSettings(settings, device, **fields)
        elif device is not None or fields:
            raise TypeError("Run(settings) takes no other arguments: put them in the RunSettings")
        self.settings = settings
        self.ranks = settings.ranks or Ranks()
        self.defaults = settings.defaults
        """True when no best-config file was found: `config` is the decorator's default, not a
        measured answer (a framework integration then leaves the user's own settings alone)."""
        self._device = torch.device(settings.device)
        self.clock = _make_clock(settings, self.ranks)
        self.config = settings.config
        sharded = self.ranks.world_size > 1 and self.config.sharding != "ddp"
        self.flops: StepFlops | None = (StepFlops() if settings.count_flops and not self.config.compile
                                        and not sharded else None)
        """Model FLOPs of one optimizer step taken after the measured ones (probes of eager, unsharded
        configs: see _flops)."""
        self._counting_step = False  # the probe's measured steps are done; this step's FLOPs are counted
        redo = settings.redo if settings.redo is not None else StepRedo(
            enabled=settings.recover_oom and not settings.probing, release_memory=settings.release_memory,
            used_memory=settings.used_memory)
        self._redo = LoopRedo(redo, probing=settings.probing)
        self._panel = KnobPanel(self._device, self.ranks, probing=settings.probing,
                                worst_token_batches=settings.worst_token_batches)
        self._feed = StepFeed(self, self.clock, self._panel, self._redo, settings.token_envelope)
        self.notes: list[str] = []
        """What the run changed in how it measures (a probe's result carries them)."""
        self.data_context: Callable[[], Any] = contextlib.nullcontext
        """Entered around every read of the data in batches(): autofit's memory estimator reads real
        data there while the step itself runs on fake tensors."""
        self.reads: set[str] = set()
        self.token_loader: TokenLoader | None = None
        self._follower = StepFollower(self, self._panel)

    # --- what the run did ---------------------------------------------------------------------
    @property
    def knobs(self) -> Knobs:
        """Which knobs the function used so far."""
        return self._panel.used

    @property
    def compile_enabled(self) -> bool:
        """False where the model must stay eager (the memory estimator's fake tensors)."""
        return self._panel.compile_enabled

    @compile_enabled.setter
    def compile_enabled(self, value: bool) -> None:
        self._panel.compile_enabled = value

    @property
    def redo(self) -> StepRedo:
        """The OOM redo this run shares with the attempts before it."""
        return self._redo.redo

    @property
    def lowerings(self) -> list[Lowering]:
        """The configs this run (and the attempts before it) lowered to after an OOM, oldest first."""
        return self.redo.lowerings

    @property
    def restart_lowering(self) -> Lowering | None:
        """Set when an OOM came before the first optimizer step: the normal call starts the function again."""
        return self._redo.restart_lowering

    @property
    def restart_config(self) -> Config | None:
        """The config to start the function again with after an OOM before the first optimizer step."""
        return self.restart_lowering.after if self.restart_lowering is not None else None

    @property
    def recovers_oom(self) -> bool:
        """True in a real run that survives an out-of-memory step by lowering its micro-batch."""
        return self._redo.recovering

    @property
    def optimizer_steps(self) -> int:
        return self.clock.steps_done

    @property
    def micro_step(self) -> int:
        """Index of the micro-batch just handed out within its optimizer step (0 = a step begins; each
        piece of a micro-batch the token guard split counts, so it is 0 once per step).

        A step redone after an out-of-memory begins again at 0 with the same data: reset whatever
        you sum per step (losses, counts) when this is 0, and nothing is counted twice."""
        return max(0, self._feed.handed_in_step - 1)

    @property
    def checked_losses(self) -> int:
        """Optimizer steps whose loss a probe checked for being finite."""
        return self._feed.checked_losses

    # --- the step -----------------------------------------------------------------------------
    def autocast(self):
        """Context for the forward pass under the chosen precision (fp32: nothing changes).

        In a real run it also catches an out-of-memory in the forward pass: the step is redone
        with a smaller micro-batch (the code between this block and `run.backward()` then runs once
        more with its previous values; `run.backward()` ignores that loss)."""
        self.knobs.autocast = True
        context = precision_context(self.config.precision, self._device)
        return OomGuard(self._feed, context, "forward") if self.recovers_oom else context

    def backward(
        self, loss: torch.Tensor, optimizer: torch.optim.Optimizer, *, clip_grad_norm: float | None = None
    ) -> None:
        """Backward with accumulation and fp16 loss scaling; steps and zeroes at step boundaries.

        `clip_grad_norm`: clip the gradients' total norm before each optimizer step (after fp16
        unscaling, over all micro-batches of the step), as `torch.nn.utils.clip_grad_norm_` would.
        """
        self._feed.backward(loss, optimizer, clip_grad_norm)

    def batches(self, iterable: Iterable[Any], *, tokens: int | Callable[[Any], int] | None = None,
                weight_by_tokens: bool = False) -> Iterator[Any]:
        """Yield micro-batches moved to the device; count samples, tokens and optimizer steps (a probe's
        loop ends via ProbeFinished once it has its steps). `tokens`: per sample (an int) or a function
        of the batch. `weight_by_tokens`: `run.backward` weighs each micro-batch's loss (a mean over its
        tokens) by its tokens: the step's gradients are then one big batch's token mean."""
        return self._feed.batches(iterable, tokens, weight_by_tokens)

    def losses_finite(self) -> bool:
        """Whether every optimizer step's loss was finite (reads the device flag: one sync); for a loop
        autofit follows, which hands it no loss, whether its optimizer's parameters are finite."""
        return self._feed.losses_finite() and (not self.knobs.followed or self._follower.params_finite())

    @property
    def skipped_steps(self) -> int:
        """Steps a loop autofit follows ran without stepping its optimizer (a GradScaler's skip, fp16)."""
        return self._follower.skipped_steps

    def lower_after_oom(self, exc: BaseException, where: str) -> bool:
        """An exception in a step that a framework's trainer drives (autofit.integrations): when it is
        an OOM and this run recovers, lower the config in place (micro-batch down, accumulation up,
        the global batch kept), record and announce it, and return True; the caller redoes the work
        (`redo.until_it_fits`). False: let it propagate. At micro-batch 1, OutOfMemoryAtBatchOne."""
        config = self._redo.in_place(self.config, exc, where, steps_done=self.clock.steps_done)
        if config is None:
            return False
        self.config = config
        return True

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
        return self._panel.distribute(self.config, model, blocks=blocks, shard=shard, offload=offload)

    def compile(self, model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
        """`torch.compile(model, **kwargs)` when the config says so, else `model` as it is: offering
        the model here lets a search probe compiled and eager as separate strategies (the compile
        time is reported apart, never counted in a probe's throughput)."""
        return self._panel.compile(self.config, model, **kwargs)

    def checkpoint(self, blocks: Sequence[torch.nn.Module]) -> Sequence[torch.nn.Module]:
        """Activation checkpointing on the first `checkpoint_segments` of `blocks`, and on none of
        the others (a model built once, at import, meets several configs in one process), under the
        config's `checkpoint_policy`: "full" recomputes each block's forward in backward, "selective"
        all of it but the matmul, convolution and attention outputs, which it keeps.

        Uses PyTorch's non-reentrant checkpoint; the modules keep their names and state-dict keys.
        """
        return self._panel.checkpoint(self.config, blocks)

    def channels_last(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` (a convolution model) in channels-last memory format when the config says so, else as it
        is: offering it here lets a search try the format on its fastest config. Back as it came at the end."""
        return self._panel.channels_last(self.config, model)

    # --- loops autofit does not drive (a framework's trainer: autofit.integrations) --------------
    def adopt_loop(self, *, checkpoint_blocks: int | None = None) -> None:
        """A framework's trainer applies this run's settings itself: every knob counts, and the clock
        starts now (call it just before the trainer's first step)."""
        self.knobs.batches = self.knobs.backward = self.knobs.autocast = True
        if checkpoint_blocks is not None:
            self.knobs.checkpoint_blocks = checkpoint_blocks
        self.clock.start()

    def step_taken(self, samples: int, tokens: int = 0) -> None:
        """A framework's trainer took one optimizer step of `samples` samples; a probe that has its
        steps ends here (ProbeFinished).

        A probe that counts FLOPs takes one step more, after its measured ones, and counts that one:
        counting changes how the steps after it run (measured 7% slower on a CPU), so it comes last.
        Every rank takes that step, whether or not its counter starts, so ranks stay in step."""
        if self._counting_step:
            self.flops.end(samples, tokens)
            raise ProbeFinished()
        self.clock.step_done(samples, tokens)
        self._redo.step_taken()
        if self.probing and self.clock.complete:
            if self.flops is not None:
                self._counting_step = True
                self.flops.begin()
                return
            raise ProbeFinished()

    def finish(self) -> None:
        """Close the last step when the function left its loop early (a `break`)."""
        self._feed.finish()

    @contextmanager
    def active(self) -> Iterator[Run]:
        """The run's lifetime: its precision holds for all of it (forward, backward, optimizer step),
        and the steps of a loop the function drives itself are followed (`StepFollower`)."""
        watching = watch_backward(self.clock.backward_done) if self.probing else contextlib.nullcontext()
        try:
            with precision_scope(self.config.precision, self._device), self._follower, watching:
                try:
                    yield self
                finally:  # what the function did to float32 matmuls, before the scope puts them back
                    self.knobs.forces_tf32 = forces_tf32(self.config.precision, self._device)
        except Exception as exc:
            if self.knobs.followed:  # the user's own loop: an OOM starts the function again
                self._redo.escaped(self.config, exc, steps_done=self.clock.steps_done)
            raise
        finally:
            if self.flops is not None and self.flops.counting:
                self.flops.abandon()  # the counted step never closed (an error, or the data ended)
            if self.probing and self.knobs.followed:
                self._follower.check_finite()  # the loop's frames, its optimizer with them, are alive still
            self._panel.restore_models()

    def summary(self) -> dict[str, Any]:
        """What this run measured after its warm-up steps: the real run's figures, next to a probe's."""
        return run_summary(self.config, self._device, self.clock, self.ranks, self.lowerings, self.token_loader,
                           guard_split_batches=self._feed.guard.split_batches,
                           oom_split_batches=self.redo.split_batches)


def _make_clock(settings: RunSettings, ranks: Ranks) -> StepClock:
    """A run's step clock: a probe's ranks agree on their step count; a probe that prices a longer
    accumulation than it runs times its steps' inner micro-batches (`InnerSpans`)."""
    agree = agree_on_most if settings.probing and ranks.world_size > 1 else None
    synchronize = settings.synchronize or (lambda: None)
    inner = InnerSpans(1, synchronize) if settings.probe_accumulation is not None else None
    return StepClock(settings.warmup_steps, settings.measured_steps, synchronize,
                     min_measure_s=settings.min_measure_s, max_measured_steps=settings.max_measured_steps,
                     agree=agree, energy=settings.energy, inner=inner, progress=settings.progress)
