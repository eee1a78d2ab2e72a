"""`StepFollower`: the optimizer steps of a loop the user wrote and keeps (its own `optimizer.step()`,
`zero_grad()`, GradScaler, clipping and batch fetching), followed through PyTorch's global optimizer
step hooks, so that such a loop is probed, timed and ended without handing its steps to `run`.

Only the first optimizer that steps is followed (a GAN's second optimizer steps within the same
iteration). A loop that drives its steps through `run.backward` or a framework's trainer is not
followed: those count their steps themselves."""

from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from autofit.runtime._dataloader import count_prefetch_as_warmup

if TYPE_CHECKING:
    from autofit.runtime._core import RunCore

#: The one line a followed normal run says about a runtime OOM (the README says the same).
OOM_LINE = ("an out-of-memory in your own loop starts the function again at a smaller micro-batch with "
            "the same global batch (what it trained so far is kept only if it saves and resumes)")


class StepFollower:
    """Counts the steps of the first optimizer that steps in a loop autofit does not drive, and
    tells the run after each (`step_taken`), with the step's samples as the config declares them.

    Silent where something else counts the steps (`run.batches`, `run.backward`, a framework's
    trainer). The run's clock starts when the first followed step
    begins, not at the function's first line."""

    def __init__(self, control: RunCore) -> None:
        self._control = control
        self._leader: weakref.ReferenceType | None = None
        self._handles: list[Any] = []
        self._passes = _Passes()
        self._fewest_backwards: int | None = None  # the fewest backward passes a followed step held
        self._finite = True
        self._told_own_accumulation = False
        self.skipped_steps = 0
        """Steps the loop ran but never stepped its optimizer for (a GradScaler's inf/NaN skip, fp16): the
        next step that did holds their micro-batches too, and counts them."""

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
        knobs = self._control.knobs
        return (knobs.batches or knobs.backward) and not knobs.followed

    def _before(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._passes.step_begins(self._control.clock.micro_batches_done)
        if self._leader is None and not self._driven():
            self._leader = weakref.ref(optimizer)
            self._starts()
        elif self._leader is not None and self._leader() is None:
            self._leader = weakref.ref(optimizer)  # the loop built a new optimizer (a new epoch, a restart)

    def _after(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        clock = self._control.clock
        self._passes.step_ends(clock.micro_batches_done)
        if self._leader is None or self._leader() is not optimizer or self._driven():
            return
        config = self._control.config
        held, outside, shared = self._passes.close(clock.micro_batches_done)
        steps = self._steps_in_this_one(held)
        samples = config.batch_size * config.accumulation_steps * steps
        if not self._control.knobs.backward and held > 0:  # it reads no accumulation: what it ran counts
            ran = steps if shared or outside <= 0 else outside
            samples = config.batch_size * ran
            if ran != config.accumulation_steps * steps and clock.measuring:
                self._say_own_accumulation(max(1, ran // steps))
        # May end a probe: ProbeFinished, out of the user's optimizer.step(), past any `except Exception`.
        self._control.step_taken(samples)

    def _say_own_accumulation(self, per_step: int) -> None:
        """Once: the loop keeps an accumulation of its own that is not the config's, so its samples are counted
        as it ran them; where a global batch was declared, its global batch is not that one."""
        if self._told_own_accumulation:
            return
        self._told_own_accumulation = True
        asked = self._control.priced_config
        said = (f"the loop keeps its own accumulation ({per_step} micro-batches a step) and reads neither "
                f"run.accumulation_steps nor run.global_batch: its samples are counted as it ran them")
        if asked.accumulation_steps > 1:
            said += (f", and its global batch is {asked.batch_size * per_step}, not the {asked.global_batch} asked "
                     f"for (read run.accumulation_steps to keep it)")
        else:
            said += (f" ({asked.batch_size} x {per_step} samples a step; declare a global_batch and read "
                     f"run.accumulation_steps to have the accumulation searched)")
        self._control.notes.append(said)

    def _steps_in_this_one(self, held: int) -> int:
        """How many of the loop's steps this optimizer step closes: one, or more where a GradScaler skipped
        the optimizer for steps before it (fp16 overflow: no `optimizer.step()`, no hook), whose micro-batches
        and time it holds. Told apart by the backward passes (a probe watches them): the fewest a step held
        is one step's."""
        if held <= 0:
            return 1  # no backward passes seen (a normal run does not watch them)
        self._fewest_backwards = held if self._fewest_backwards is None else min(self._fewest_backwards, held)
        steps = max(1, int(held / self._fewest_backwards + 0.25))  # a GAN's 3 against 2 is one step
        self.skipped_steps += steps - 1
        return steps

    def check_finite(self) -> None:
        """At a probe's end, while the loop's frames (and its optimizer) are still alive: whether the followed
        optimizer's parameters are all finite. A loop autofit does not drive hands it no loss, and a step of
        inf or NaN leaves its mark there (one device sync; never inside the measured steps)."""
        optimizer = self._leader() if self._leader is not None else None
        params = [p for group in optimizer.param_groups for p in group["params"] if p.numel()] if optimizer else []
        if params:
            with torch.no_grad():
                self._finite = bool(torch.stack([torch.isfinite(p).all() for p in params]).all().item())

    def params_finite(self) -> bool:
        """What `check_finite` found (True where it found nothing to check)."""
        return self._finite

    def _starts(self) -> None:
        """The first step of the function's own loop begins: the clock starts, the knobs it used are
        the settings it read, and a normal run says what an OOM does to such a loop."""
        control, knobs = self._control, self._control.knobs
        knobs.followed = True
        knobs.batches = knobs.batches or bool(control.reads & {"batch_size", "global_batch"})
        knobs.backward = bool(control.reads & {"accumulation_steps", "global_batch"})
        knobs.autocast = knobs.autocast or "precision" in control.reads
        if control.clock.inner is not None and not knobs.backward:
            control.clock.inner.pricing = False  # its own accumulation is not priced: nothing to time in it
        control.clock.start()
        training = control.panel.training_loader
        if training is not None:
            training.waited = self._waited
            count_prefetch_as_warmup(training, control.config.accumulation_steps, control.clock, control.notes)
        if control.loop_redo.recovering and control.ranks.is_main:
            print(f"autofit: following your loop's optimizer steps; {OOM_LINE}", file=sys.stderr, flush=True)

    def _waited(self, seconds: float) -> None:
        if self._control.knobs.followed:
            self._control.clock.data_waited(seconds)


class _Passes:
    """The backward passes (micro-batches, or several a micro-batch) since the last followed step closed, as
    the optimizer steps split them: those inside a step (a closure's, LBFGS's or SAM's) are no micro-batches,
    and passes of their own before two optimizers' steps (a GAN's critic, then its generator) are over one
    batch; two optimizers stepped back to back (Muon beside AdamW) share theirs."""

    def __init__(self) -> None:
        self._at_close = 0  # the run's backward passes when the last followed step closed
        self._at_step_end = 0  # ... when the last step of any optimizer ended
        self._at_step_begin: int | None = None  # ... when the step running now began
        self._inside = 0
        self._own_runs = 0  # steps since the last followed one with passes of their own before them

    def step_begins(self, done: int) -> None:
        if done > self._at_step_end:
            self._own_runs += 1
        self._at_step_begin = done

    def step_ends(self, done: int) -> None:
        if self._at_step_begin is not None:
            self._inside += done - self._at_step_begin
            self._at_step_begin = None
        self._at_step_end = done

    def close(self, done: int) -> tuple[int, int, bool]:
        """The followed step closed: (passes since the last one, those outside any optimizer step, whether
        they are split between optimizers, a GAN's); 0 passes where none is watched (a normal run)."""
        held = done - self._at_close
        counts = (held, held - self._inside, self._own_runs >= 2)
        self._at_close, self._inside, self._own_runs = done, 0, 0
        return counts
