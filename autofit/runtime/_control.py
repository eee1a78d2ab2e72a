"""`RunControl`: autofit's own handle on a run (`run.control`), apart from what a training function uses.

The probe, the normal call, the memory estimator and the framework integrations drive a run through it:
what its parts share (`RunCore`: its config, set there and nowhere else, its step clock, the knobs the
function offered, the OOM redo, the FLOP counter), the steps of a loop autofit feeds or follows
(`StepFeed`, `StepFollower`, each given this control), the run's lifetime and its summary."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from autofit.runtime._attention import attention_scope, watch_attention
from autofit.runtime._core import RunCore
from autofit.runtime._feed import StepFeed
from autofit.runtime._follow import StepFollower
from autofit.runtime._precision import forces_tf32, precision_scope
from autofit.runtime._report import run_summary
from autofit.runtime._settings import RunSettings


class RunControl(RunCore):
    """What autofit, not the training function, does with a run: set its config, start and end it, count
    and measure its steps, redo the step an OOM broke, and sum up what it measured."""

    def __init__(self, settings: RunSettings) -> None:
        super().__init__(settings)
        self.feed = StepFeed(self, settings.token_envelope)
        self.follower = StepFollower(self)

    # --- what the run did -------------------------------------------------------------------------
    @property
    def checked_losses(self) -> int:
        """Optimizer steps whose loss a probe checked for being finite."""
        return self.feed.checked_losses

    def losses_finite(self) -> bool:
        """Whether every optimizer step's loss was finite (reads the device flag: one sync); for a loop
        autofit follows, which hands it no loss, whether its optimizer's parameters are finite."""
        return self.feed.losses_finite() and (not self.knobs.followed or self.follower.params_finite())

    @property
    def skipped_steps(self) -> int:
        """Steps a loop autofit follows ran without stepping its optimizer (a GradScaler's skip, fp16)."""
        return self.follower.skipped_steps

    # --- the run's lifetime -----------------------------------------------------------------------
    @contextmanager
    def active(self) -> Iterator[None]:
        """The run's lifetime: its precision and attention kernel hold for all of it (forward, backward,
        optimizer step; a probe notes the kernels its attention can run: watch_attention),
        and the steps of a loop the function drives itself are followed (`StepFollower`)."""
        probing = self.settings.probing
        watching = self.open_step.watching() if probing else contextlib.nullcontext()
        backend = self.config.sdpa_backend
        kernels = watch_attention(self.knobs) if probing and backend is None else contextlib.nullcontext()
        try:
            self.panel.bound_caches()
            with precision_scope(self.config.precision, self.device), attention_scope(backend), kernels, \
                    self.follower, watching:
                try:
                    yield
                finally:  # what the function did to float32 matmuls, before the scope puts them back
                    self.knobs.forces_tf32 = forces_tf32(self.config.precision, self.device)
        except Exception as exc:
            if self.knobs.followed:  # the user's own loop: an OOM starts the function again
                self.loop_redo.escaped(self.config, exc, steps_done=self.clock.steps_done)
            raise
        finally:
            if self.flops is not None and self.flops.counting:
                self.flops.abandon()  # the counted step never closed (an error, or the data ended)
            if probing and self.knobs.followed:
                self.follower.check_finite()  # the loop's frames, its optimizer with them, are alive still
            self.panel.restore_models()

    def summary(self) -> dict[str, Any]:
        """What this run measured after its warm-up steps: the real run's figures, next to a probe's."""
        return run_summary(self.config, self.device, self.clock, self.ranks, self.redo.lowerings,
                           self.token_loader, guard_split_batches=self.feed.guard.split_batches,
                           oom_split_batches=self.redo.split_batches)
