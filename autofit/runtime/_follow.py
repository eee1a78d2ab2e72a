"""`StepFollower`: the optimizer steps of a loop the user wrote and keeps (its own `optimizer.step()`,
`zero_grad()`, GradScaler, clipping and batch fetching), followed through PyTorch's global optimizer
step hooks, so that such a loop is probed, timed and ended without handing its steps to `run`.

Only the first optimizer that steps is followed (a GAN's second optimizer steps within the same
iteration). A loop that drives its steps through `run.backward` or a framework's trainer is not
followed: those count their steps themselves."""

from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from autofit.config import Config
from autofit.runtime._clock import StepClock
from autofit.runtime._dataloader import count_prefetch_as_warmup

if TYPE_CHECKING:
    from autofit.runtime._knobs import KnobPanel, Knobs

#: The one line a followed normal run says about a runtime OOM (the README says the same).
OOM_LINE = ("an out-of-memory in your own loop starts the function again at a smaller micro-batch with "
            "the same global batch (what it trained so far is kept only if it saves and resumes)")


class FollowedRun(Protocol):
    """What the follower reads and writes of the run whose loop it follows (`Run` is one)."""

    config: Config
    notes: list[str]
    reads: set[str]
    clock: StepClock

    @property
    def knobs(self) -> Knobs: ...

    @property
    def recovers_oom(self) -> bool: ...

    @property
    def is_main(self) -> bool: ...

    def step_taken(self, samples: int, tokens: int = 0) -> None: ...


class StepFollower:
    """Counts the steps of the first optimizer that steps in a loop autofit does not drive, and
    tells the run after each (`step_taken`), with the step's samples as the config declares them.

    Silent where something else counts the steps (`run.batches`, `run.backward`, a framework's
    trainer). The run's clock starts when the first followed step
    begins, not at the function's first line."""

    def __init__(self, run: FollowedRun, panel: KnobPanel) -> None:
        self._run, self._panel = run, panel
        self._leader: weakref.ReferenceType | None = None
        self._handles: list[Any] = []

    def __enter__(self) -> StepFollower:
        self._handles = [register_optimizer_step_pre_hook(self._before),
                         register_optimizer_step_post_hook(self._after)]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()  # global hooks: nothing of this run reaches the next one in this process
        self._handles = []

    def _driven(self) -> bool:
        """Something else counts the steps: `run.batches` or `run.backward` (or a framework's trainer,
        which sets both) was used before the loop's first step."""
        knobs = self._run.knobs
        return (knobs.batches or knobs.backward) and not knobs.followed

    def _before(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._leader is None and not self._driven():
            self._leader = weakref.ref(optimizer)
            self._starts()
        elif self._leader is not None and self._leader() is None:
            self._leader = weakref.ref(optimizer)  # the loop built a new optimizer (a new epoch, a restart)

    def _after(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._leader is None or self._leader() is not optimizer or self._driven():
            return
        config = self._run.config
        # May end a probe: ProbeFinished, out of the user's optimizer.step(), past any `except Exception`.
        self._run.step_taken(config.batch_size * config.accumulation_steps)

    def _starts(self) -> None:
        """The first step of the function's own loop begins: the clock starts, the knobs it used are
        the settings it read, and a normal run says what an OOM does to such a loop."""
        run, knobs = self._run, self._run.knobs
        knobs.followed = True
        knobs.batches = knobs.batches or bool(run.reads & {"batch_size", "global_batch"})
        knobs.backward = bool(run.reads & {"accumulation_steps", "global_batch"})
        knobs.autocast = knobs.autocast or "precision" in run.reads
        run.clock.start()
        training = self._panel.training_loader
        if training is not None:
            training.waited = self._waited
            count_prefetch_as_warmup(training, run.config.accumulation_steps, run.clock, run.notes)
        if run.recovers_oom and run.is_main:
            print(f"autofit: following your loop's optimizer steps; {OOM_LINE}", file=sys.stderr, flush=True)

    def _waited(self, seconds: float) -> None:
        if self._run.knobs.followed:
            self._run.clock.data_waited(seconds)
