"""OOM recovery inside a framework's training loop (HF Trainer, Lightning).

The trainer keeps its loader, its accumulation and its optimizer steps. After an out-of-memory,
the run's config is lowered (autofit.runtime._redo) and each micro-batch the trainer hands over is cut
into pieces of the lowered micro-batch, run one after another, each loss weighted by its share of
the micro-batch's samples: the gradient is the one the whole micro-batch gives, the global batch is
unchanged. A forward OOM leaves the gradients whole, so only that micro-batch is run again; an OOM
in a backward leaves part of one in them, so they are zeroed and the optimizer step's micro-batches
so far are fed again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from autofit.runtime import Run, count_samples, split_batch

T = TypeVar("T")
#: Runs one piece of a micro-batch, forward and backward: (piece, weight, context) -> its result.
PieceWork = Callable[[Any, float, Any], T]


class StepRecovery:
    """The optimizer step being fed (its micro-batches, as the trainer handed them over) and the
    redo after an OOM. `where` is kept current by the integration: "forward" or "backward"."""

    def __init__(self, run: Run, zero_grad: Callable[[], None]) -> None:
        self._run = run
        self._zero_grad = zero_grad
        self._step: list[tuple[Any, Any]] = []
        self.where = "forward"

    def add(self, batch: Any, context: Any = None) -> None:
        """A micro-batch of the step being fed (and what its work needs besides the batch)."""
        self._step.append((batch, context))

    def step_done(self) -> None:
        self._step.clear()

    def pieces(self, batch: Any) -> list[tuple[Any, float]]:
        """`batch` cut to the run's micro-batch, each piece with its share of the batch's samples."""
        parts = split_batch(batch, self._run.batch_size)
        if len(parts) == 1:
            return [(batch, 1.0)]
        total = count_samples(batch)
        return [(part, count_samples(part) / total) for part in parts]

    def lowered(self, exc: BaseException) -> bool:
        """Whether `exc` is an OOM the run recovers from (its config is then lowered)."""
        return self._run.lower_after_oom(exc, self.where)

    def feed(self, batch: Any, context: Any, work: PieceWork) -> list:
        """Add `batch` to the step and run `work` on each of its pieces, recovering from OOMs."""
        self.add(batch, context)
        while True:
            try:
                return [work(piece, weight, context) for piece, weight in self.pieces(batch)]
            except Exception as exc:
                if not self.lowered(exc):
                    raise
                whole_step = self.where != "forward"
            if whole_step:
                return self.redo_step(work)
            self._run.release_memory()  # the failed forward's memory, now that its exception is gone

    def redo_step(self, work: PieceWork) -> list:
        """Zero the gradients and feed every micro-batch of the step so far again, piece by piece,
        lowering again on a further OOM. Returns the results of the last micro-batch's pieces."""
        while True:
            self._zero_grad()
            self._run.release_memory()
            try:
                results: list = []
                for batch, context in self._step:
                    results = [work(piece, weight, context) for piece, weight in self.pieces(batch)]
                return results
            except Exception as exc:
                if not self.lowered(exc):
                    raise
