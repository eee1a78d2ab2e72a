"""`OpenStep`: a probe whose micro-batches keep coming while no optimizer step closes ends, with its reason.

A loop that skips `optimizer.step()` on a non-finite loss (a common guard), or whose GradScaler skips every
step, runs backward passes for ever and never reaches its measured steps: its micro-batches are progress to
the runner (autofit.probing's `ProbeWatch`), so it ran until the search's budget was gone, a "budget cut" no
budget mends. So past `open_limit` micro-batches with no step closed, a probe whose loss or gradients are NaN
or inf ends at once (`NoStepClosed`, diverged).

A finite loss past that limit proves nothing: a loop may accumulate thousands of micro-batches itself
(build-nanogpt's `grad_accum_steps = total_batch_size // (B * T)`: 2048 at a micro-batch of 1), and whether the
search worked then hung on its pilot's size. So where the probe was given a time for it (`allowance_s`: what
its limits allow a step, `ProbeLimits.open_step_s`), it follows the loop to its first step for that long,
and says so; past it, or without one (the memory estimator, a Run built by hand), it ends as an error. The
limit grows to the micro-batches that time holds at the loop's pace, worked out once and agreed by every rank
(a count, not a clock: ranks that stop at different micro-batches would wait in a collective for ever).

A GradScaler's skipped step (fp16's start, while it halves its scale from 2**16) is a step the loop tried to
take: `GradScaler.step` is watched, and the micro-batches before it are no open ones. A loop whose scaler skips
more than `OPEN_STEPS` steps in a row (2**16 to 2**-16) has gradients that are never finite: diverged."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from autofit.runtime._accumulation import watch_backward

#: Micro-batches with no optimizer step closed that a probe always allows (before its first step, too).
FLOOR_MICRO_BATCHES = 256
#: Steps' worth of micro-batches with no step closed that a probe allows, and a GradScaler's skipped steps in a
#: row (each skip halves its scale once: 32 take it from 2**16 to 2**-16).
OPEN_STEPS = 32


class NoStepClosed(BaseException):
    """Out of a probe's backward pass: `micro_batches` have run since an optimizer step last closed.
    `finite`: whether the loss and its gradients were finite (None: not known, fake tensors). `waited_s`: how
    long the loop was followed past the floor (None: it was not); `skipped`: the GradScaler's steps skipped in a
    row where that ended it.

    A BaseException, so that a user's `except Exception` around the loop does not swallow it."""

    def __init__(self, micro_batches: int, finite: bool | None, *, waited_s: float | None = None,
                 skipped: int = 0) -> None:
        super().__init__(f"no optimizer step closed in {micro_batches} micro-batches")
        self.micro_batches = micro_batches
        self.finite = finite
        self.waited_s = waited_s
        self.skipped = skipped


def open_limit(accumulation: int, fewest_per_step: int | None) -> int:
    """Backward passes a probe allows with no optimizer step closed before it looks at them: `OPEN_STEPS` steps
    of the config's accumulation or of the fewest backward passes a closed step held (a GAN's two a micro-batch,
    a loop's own accumulation), and never fewer than `FLOOR_MICRO_BATCHES`."""
    return max(FLOOR_MICRO_BATCHES, OPEN_STEPS * max(accumulation, fewest_per_step or 0))


class OpenStep:
    """Watches a probe's backward passes (`before`, `after`) and its GradScaler's steps against its clock's
    closed steps (`watching`): the backward pass past the limit raises `NoStepClosed`, with whether its loss and
    gradients were finite (read then only: that pass's graph is walked for its parameters before it runs),
    unless a finite loop is followed on for `allowance_s`."""

    def __init__(self, clock: Any, allowance_s: float | None = None, notes: list[str] | None = None,
                 agree: Callable[[int], int] | None = None) -> None:
        self.clock = clock
        """The run's StepClock: its backward passes since the last closed step, and the fewest a step held."""
        self.accumulation = 1
        """Micro-batches a step of the config the probe runs (set with the config)."""
        self.allowance_s = allowance_s
        """How long a finite loop is followed to its next step past the limit (None: not at all)."""
        self._notes = notes if notes is not None else []
        self._agree = agree
        self._watched: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        self._opened_at: float | None = None  # when the first open backward pass returned
        self._followed: tuple[int, int, float] | None = None  # (steps done, the grown limit, since when)
        self._attempted_at = 0  # micro-batches done when the GradScaler last skipped a step
        self._skipped = 0  # the GradScaler's skipped steps in a row
        self._stepped = 0  # optimizer steps begun (any optimizer's)

    @property
    def limit(self) -> int:
        followed = self._followed
        if followed is not None and followed[0] == self.clock.steps_done:
            return followed[1]
        return open_limit(self.accumulation, self.clock.fewest_per_step)

    @property
    def open_micro_batches(self) -> int:
        """Backward passes since a step closed or the GradScaler last skipped one."""
        clock = self.clock
        return min(clock.open_micro_batches, clock.micro_batches_done - self._attempted_at)

    @contextmanager
    def watching(self) -> Iterator[None]:
        """While a probe runs: its backward passes, and its GradScalers' steps (a skipped one is a step tried)."""
        original = torch.amp.GradScaler.step
        handle = register_optimizer_step_pre_hook(self._optimizer_steps)

        def step(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            stepped = self._stepped
            result = original(scaler, optimizer, *args, **kwargs)
            self._tried(stepped=self._stepped > stepped)
            return result

        step.__wrapped__ = original  # type: ignore[attr-defined]
        torch.amp.GradScaler.step = step  # type: ignore[method-assign]
        try:
            with watch_backward(self.after, before=self.before):
                yield
        finally:
            torch.amp.GradScaler.step = original  # type: ignore[method-assign]
            handle.remove()

    def _optimizer_steps(self, *_: Any) -> None:
        self._stepped += 1
        self._skipped = 0

    def _tried(self, *, stepped: bool) -> None:
        """A GradScaler's step returned: it stepped its optimizer, or skipped the step (inf or NaN gradients)."""
        if stepped:
            return
        self._skipped += 1
        self._attempted_at = self.clock.micro_batches_done
        if self._skipped > OPEN_STEPS:
            raise NoStepClosed(self.clock.open_micro_batches, False, skipped=self._skipped)

    def before(self, tensors: Any) -> None:
        """A backward pass of `tensors` (the loss) begins: the one past the limit keeps its loss and the
        parameters its graph reaches (their gradients are read after it)."""
        if self.open_micro_batches + 1 > self.limit:
            roots = [t for t in (tensors if isinstance(tensors, (list, tuple)) else [tensors])
                     if isinstance(t, torch.Tensor)]
            self._watched = ([t.detach() for t in roots], _leaves(roots))

    def after(self) -> None:
        """A backward pass returned: counted on the clock; past the limit, the probe ends or, for a finite loss
        with time allowed, follows the loop on."""
        self.clock.backward_done()
        open_now = self.open_micro_batches
        if open_now == 1:
            self._opened_at = time.perf_counter()
        if open_now <= self.limit:
            return
        finite = self._finite()
        self._watched = None
        if self._follow_on(open_now, finite):
            return
        followed = self._followed
        waited = time.perf_counter() - followed[2] if followed is not None else None
        raise NoStepClosed(open_now, finite, waited_s=waited)

    def _follow_on(self, open_now: int, finite: bool | None) -> bool:
        """Past the limit the first time in this open stretch, with a finite loss and time allowed: the limit
        grows to what `allowance_s` holds at the loop's pace so far (every rank agrees on the smallest), and
        the probe says so. False: it ends."""
        if self.allowance_s is None or self._followed is not None and self._followed[0] == self.clock.steps_done:
            return False
        now = time.perf_counter()
        pace = (now - self._opened_at) / max(1, open_now - 1) if self._opened_at is not None else 0.0
        grown = open_now + int(self.allowance_s / pace) if finite is not False and pace > 0 else 0
        if self._agree is not None:  # the smallest any rank allows (0: one saw inf or NaN)
            grown = -self._agree(-grown)
        if grown <= open_now:
            return False
        self._followed = (self.clock.steps_done, grown, now)
        said = (f"no optimizer step closed in the first {open_now - 1} micro-batches and the loss was finite: the "
                f"loop may accumulate more itself, so the probe followed it to its next step (for up to "
                f"{self.allowance_s:.0f} s, what its limits allow a step)")
        self._notes.append(said)
        print(f"autofit: {said}", file=sys.stderr, flush=True)
        return True

    def _finite(self) -> bool | None:
        if self._watched is None:
            return None
        losses, leaves = self._watched
        values = losses + [p.grad for p in leaves if p.grad is not None]
        try:
            with torch.no_grad():
                return all(bool(torch.isfinite(v).all()) for v in values)
        except Exception:  # noqa: BLE001 - a value-free tensor (the memory estimator's) has no answer
            return None


def _leaves(roots: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors whose gradients a backward pass from `roots` accumulates (its graph's leaves)."""
    stack = [t.grad_fn for t in roots if t.grad_fn is not None]
    seen: set[Any] = set()
    leaves = []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # an AccumulateGrad node: a leaf's
        if isinstance(variable, torch.Tensor):
            leaves.append(variable)
        stack.extend(parent for parent, _ in node.next_functions)
    return leaves
