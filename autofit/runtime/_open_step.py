"""`OpenStep`: a probe whose micro-batches keep coming while no optimizer step closes ends at once.

A loop that skips `optimizer.step()` on a non-finite loss (a common guard), or whose GradScaler skips every
step, runs backward passes for ever and never reaches its measured steps: its micro-batches are progress to
the runner (autofit.probing's `ProbeWatch`), so it ran until the search's budget was gone, a "budget cut" no
budget mends. So past `open_limit` micro-batches with no step closed, the probe ends (`NoStepClosed`), as
diverged where the loss or its gradients are NaN or inf, as an error otherwise.

The limit is generous on purpose. Before the first step the loop's own accumulation is unknown (one that
accumulates 64 // batch_size micro-batches itself runs 64 at b=1 under a config of acc=1), and a GradScaler
at its start skips a run of steps while it halves its scale from 2**16 (each skip halves it once)."""

from __future__ import annotations

from typing import Any

import torch

#: Micro-batches with no optimizer step closed that a probe always allows (before its first step, too).
FLOOR_MICRO_BATCHES = 256
#: Steps' worth of micro-batches with no step closed that a probe allows (a GradScaler's run of skips at
#: its start halves its scale once a skip: 32 take it from 2**16 to 2**-16).
OPEN_STEPS = 32


class NoStepClosed(BaseException):
    """Out of a probe's backward pass: `micro_batches` have run since an optimizer step last closed.
    `finite`: whether the loss and its gradients were finite (None: not known, fake tensors).

    A BaseException, so that a user's `except Exception` around the loop does not swallow it."""

    def __init__(self, micro_batches: int, finite: bool | None) -> None:
        super().__init__(f"no optimizer step closed in {micro_batches} micro-batches")
        self.micro_batches = micro_batches
        self.finite = finite


def open_limit(accumulation: int, fewest_per_step: int | None) -> int:
    """Backward passes a probe allows with no optimizer step closed: `OPEN_STEPS` steps of the config's
    accumulation or of the fewest backward passes a closed step held (a GAN's two a micro-batch, a loop's
    own accumulation), and never fewer than `FLOOR_MICRO_BATCHES`."""
    return max(FLOOR_MICRO_BATCHES, OPEN_STEPS * max(accumulation, fewest_per_step or 0))


class OpenStep:
    """Watches a probe's backward passes (`before`, `after`) against its clock's closed steps: the backward
    pass past the limit raises `NoStepClosed`, with whether its loss and gradients were finite (read then
    only: that pass's graph is walked for its parameters before it runs)."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        """The run's StepClock: its backward passes since the last closed step, and the fewest a step held."""
        self.accumulation = 1
        """Micro-batches a step of the config the probe runs (set with the config)."""
        self._watched: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None

    @property
    def limit(self) -> int:
        return open_limit(self.accumulation, self.clock.fewest_per_step)

    def before(self, tensors: Any) -> None:
        """A backward pass of `tensors` (the loss) begins: the one past the limit keeps its loss and the
        parameters its graph reaches (their gradients are read after it)."""
        if self.clock.open_micro_batches + 1 > self.limit:
            roots = [t for t in (tensors if isinstance(tensors, (list, tuple)) else [tensors])
                     if isinstance(t, torch.Tensor)]
            self._watched = ([t.detach() for t in roots], _leaves(roots))

    def after(self) -> None:
        """A backward pass returned: counted on the clock; past the limit, the probe ends."""
        self.clock.backward_done()
        if self.clock.open_micro_batches > self.limit:
            finite = self._finite()
            self._watched = None
            raise NoStepClosed(self.clock.open_micro_batches, finite)

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
