"""`RunCore`: what a run's parts share (the feed, the follower, a framework's `PieceReplay`): the config
the run trains with, set here and nowhere else (`set_config`), its step clock, the knobs the function
offered (`KnobPanel`), the OOM redo (`LoopRedo` over the one `StepRedo`), the FLOP counter, the count of
its optimizer steps (`step_taken`) and the hooks it was built with (`RunHooks`). `RunControl` is one,
with the parts on it; the parts take it, never the `Run`."""

from __future__ import annotations

from dataclasses import replace

import torch

from autofit.config import Config
from autofit.runtime._accumulation import InnerSpans
from autofit.runtime._clock import ProbeFinished, StepClock
from autofit.runtime._distributed import Ranks, agree_on_most
from autofit.runtime._flops import StepFlops
from autofit.runtime._knobs import KnobPanel, Knobs
from autofit.runtime._open_step import OpenStep
from autofit.runtime._redo import LoopRedo, Lowering, StepRedo
from autofit.runtime._settings import RunHooks, RunSettings
from autofit.runtime._tokens import TokenBatchSampler, TokenLoader


class RunCore:
    """A run's config, clock, knobs and OOM redo, and the steps it counted: what its parts read and tell."""

    def __init__(self, settings: RunSettings) -> None:
        self.settings = settings
        self.hooks: RunHooks = settings.hooks
        """What the run's builder asked to be called at its seams (the memory estimator's)."""
        self.ranks = settings.ranks or Ranks()
        """Where this process stands in a distributed (torchrun) run; rank 0 of 1 otherwise."""
        self.device = torch.device(settings.device)
        self.clock = _make_clock(settings, self.ranks)
        self.notes: list[str] = []
        """What the run changed in how it measures (a probe's result carries them)."""
        self.open_step = OpenStep(self.clock, settings.open_step_s, self.notes, agree=self.clock.agree)
        """A probe's backward passes with no optimizer step closed: past its limit, the probe ends (NoStepClosed)
        or follows a finite loop on for the time its limits allow."""
        self.config: Config = settings.config
        self._priced_accumulation = settings.config.accumulation_steps
        self.set_config(settings.config)
        sharded = self.ranks.world_size > 1 and self.config.sharding != "ddp"
        self.flops: StepFlops | None = (StepFlops() if settings.count_flops and not self.config.compile
                                        and not sharded else None)
        """Model FLOPs of one optimizer step taken after the measured ones (probes of eager, unsharded
        configs: see _flops)."""
        self._counting_step = False  # the probe's measured steps are done; this step's FLOPs are counted
        redo = settings.redo if settings.redo is not None else StepRedo(
            enabled=settings.recover_oom and not settings.probing, release_memory=settings.release_memory,
            used_memory=settings.used_memory)
        self.loop_redo = LoopRedo(redo, probing=settings.probing)
        self.panel = KnobPanel(self.device, self.ranks, probing=settings.probing,
                               worst_token_batches=settings.worst_token_batches, host_memory=settings.host_memory,
                               window_steps=(settings.measured_steps or 0) if settings.probing else 0,
                               shape_caches=settings.token_envelope.caches if settings.token_envelope else None)
        self.reads: set[str] = set()
        """The settings the function read (`run.batch_size`, ...): a loop autofit follows through its
        optimizer's steps uses what it read, and only that is searched."""
        self.token_loader: TokenLoader | None = None
        """The loader run.token_batches() built last (its batches' padding share goes in the summary)."""

    # --- the config -----------------------------------------------------------------------------
    def set_config(self, config: Config) -> None:
        """The one place a run's config changes: at its start, after an OOM lowered it, where a framework's
        trainer stands (autofit.integrations), by the token batches' accumulation. In a probe of a config
        that accumulates more than `RunSettings.probe_accumulation`, that many micro-batches a step:
        `priced_config` is the config its figures are for."""
        self._priced_accumulation = config.accumulation_steps
        cap = self.settings.probe_accumulation
        if cap is not None and config.accumulation_steps > cap:
            config = replace(config, accumulation_steps=cap)
        self.config = config
        self.open_step.accumulation = config.accumulation_steps
        if self.clock.inner is not None:
            self.clock.inner.per_step = config.accumulation_steps
            self.clock.inner.pricing = self._priced_accumulation > config.accumulation_steps

    @property
    def priced_config(self) -> Config:
        """The config this run's figures are for: `config` with the accumulation it stands for (a probe
        that runs fewer micro-batches a step prices a step of these)."""
        if self._priced_accumulation == self.config.accumulation_steps:
            return self.config
        return replace(self.config, accumulation_steps=self._priced_accumulation)

    def probe_over(self, sampler: TokenBatchSampler) -> None:
        """A probe's steps over token batches: its warm-up over the worst batches and those that pay its window's
        shapes ahead (TokenBatchSampler.warm_batches), and its measured steps within one epoch, where every shape
        is new as in a normal run's first epoch (past it, each is met again: a second pass reads faster than the
        epoch a run trains), unless the epoch is shorter than the steps a probe measures at least."""
        if not self.settings.probing:
            return
        clock, per_step = self.clock, max(1, self.config.accumulation_steps)
        with self.hooks.data_context():  # the sampler's draws are real data (the memory estimator's run is fake)
            batches, epoch = sampler.warm_batches(), len(sampler)
        steps = -(-batches // per_step)
        if steps > clock.warmup_steps:
            self.notes.append(f"warm-up of {steps} steps: {batches} batches, the worst and those that meet the "
                              f"window's shapes ahead, as often as its epoch meets them")
            clock.warmup_steps = steps
        left = (epoch - clock.warmup_steps * per_step) // per_step
        if clock.max_measured_steps is not None and left >= (clock.measured_steps or 0):
            clock.max_measured_steps = min(clock.max_measured_steps, left)

    # --- what the run did -------------------------------------------------------------------------
    @property
    def knobs(self) -> Knobs:
        """Which knobs the function used so far."""
        return self.panel.used

    @property
    def compile_enabled(self) -> bool:
        """False where the model must stay eager (the memory estimator's fake tensors)."""
        return self.panel.compile_enabled

    @compile_enabled.setter
    def compile_enabled(self, value: bool) -> None:
        self.panel.compile_enabled = value

    @property
    def redo(self) -> StepRedo:
        """The OOM redo this run shares with the attempts before it."""
        return self.loop_redo.redo

    @property
    def restart_lowering(self) -> Lowering | None:
        """Set when an OOM came before the first optimizer step: the normal call starts the function again."""
        return self.loop_redo.restart_lowering

    @property
    def restart_config(self) -> Config | None:
        """The config to start the function again with after an OOM before the first optimizer step."""
        return self.restart_lowering.after if self.restart_lowering is not None else None

    # --- loops autofit does not drive (a framework's trainer: autofit.integrations) --------------
    def lower_after_oom(self, exc: BaseException, where: str) -> bool:
        """An exception in a step that a framework's trainer drives (autofit.integrations): when it is
        an OOM and this run recovers, lower the config in place (micro-batch down, accumulation up,
        the global batch kept), record and announce it, and return True; the caller redoes the work
        (`redo.until_it_fits`). False: let it propagate. At micro-batch 1, OutOfMemoryAtBatchOne."""
        config = self.loop_redo.in_place(self.config, exc, where, steps_done=self.clock.steps_done)
        if config is None:
            return False
        self.set_config(config)
        return True

    def adopt_loop(self, *, checkpoint_blocks: int | None = None) -> None:
        """A framework's trainer applies this run's settings itself: every knob counts, and the clock
        starts now (call it just before the trainer's first step)."""
        self.knobs.batches = self.knobs.backward = self.knobs.autocast = True
        if checkpoint_blocks is not None:
            self.knobs.checkpoint_blocks = checkpoint_blocks
        self.clock.start()

    def step_taken(self, samples: int, tokens: int = 0) -> None:
        """A framework's trainer took one optimizer step of `samples` samples; a probe that has its
        steps ends here (ProbeFinished). The hooks' `after_step` follows each step that did not end it.

        A probe that counts FLOPs takes one step more, after its measured ones, and counts that one:
        counting changes how the steps after it run (measured 7% slower on a CPU), so it comes last.
        Every rank takes that step, whether or not its counter starts, so ranks stay in step."""
        if self._counting_step:
            self.flops.end(samples, tokens)
            raise ProbeFinished()
        self.clock.step_done(samples, tokens)
        self.loop_redo.step_taken()
        if self.settings.probing and self.clock.complete:
            if self.flops is None:
                raise ProbeFinished()
            self._counting_step = True
            self.flops.begin()
        self.hooks.after_step()


def _make_clock(settings: RunSettings, ranks: Ranks) -> StepClock:
    """A run's step clock: a probe's ranks agree on their step count; a probe that prices a longer
    accumulation than it runs times its steps' inner micro-batches (`InnerSpans`)."""
    agree = agree_on_most if settings.probing and ranks.world_size > 1 else None
    synchronize = settings.synchronize or (lambda: None)
    inner = InnerSpans(1, synchronize) if settings.probe_accumulation is not None else None
    counters = {name: read for name, read in (("energy_j", settings.energy), ("alloc_retries", settings.alloc_retries))
                if read is not None}
    return StepClock(settings.warmup_steps, settings.measured_steps, synchronize,
                     min_measure_s=settings.min_measure_s, max_measured_steps=settings.max_measured_steps,
                     agree=agree, counters=counters, inner=inner, progress=settings.progress, timing=settings.timing)
