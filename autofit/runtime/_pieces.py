"""The redo inside a framework's training loop (HF Trainer, Lightning, Accelerate), in pieces.

The framework keeps its loader, its accumulation and its optimizer steps. After an out-of-memory,
the run's config is lowered (the run's StepRedo) and each micro-batch the framework hands over is cut
into pieces of the lowered micro-batch, run one after another, each loss weighted by its share of the
micro-batch's samples: the gradient is the one the whole micro-batch gives, the global batch is
unchanged. A forward OOM leaves the gradients whole, so only that micro-batch is run again; an OOM in
a backward leaves part of one in them, so they are zeroed and the optimizer step's micro-batches so far
are fed again. The integrations only adapt their framework's step to `PieceReplay`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from autofit.errors import UsageError
from autofit.runtime._batch import count_samples, split_batch
from autofit.runtime._redo import drop_graph

if TYPE_CHECKING:
    from autofit.runtime._core import RunCore

T = TypeVar("T")
#: Runs one piece of a micro-batch, forward and backward: (piece, weight, context) -> its result.
PieceWork = Callable[[Any, float, Any], T]

_NO_LOSS = ("After an out-of-memory the micro-batch is run in pieces, which needs the loss the model "
            "returns (pass labels to an HF model); this model returns none.")


def loss_of(output: Any) -> torch.Tensor | None:
    """The loss in a step's output: the output itself when a scalar tensor, else its "loss"."""
    if isinstance(output, torch.Tensor):
        return output if output.dim() == 0 else None
    if isinstance(output, dict):
        return output.get("loss")
    return getattr(output, "loss", None)


def weighted(output: Any, weight: float) -> Any:
    """`output` with its loss times `weight`: a new output, the user's own left as it was (a copy of a
    dict or an HF ModelOutput keeps its type, and a ModelOutput its `.loss` in step)."""
    if weight == 1.0 or output is None:
        return output
    if isinstance(output, torch.Tensor):
        return output * weight
    scaled = copy.copy(output)
    scaled["loss"] = output["loss"] * weight
    return scaled


class PieceReplay:
    """The optimizer step being fed (its micro-batches, as the framework handed them over) and its
    replay in pieces after an OOM. `where` is kept current by the integration: "forward" or "backward".
    Built on the run's control (`run.control`), whose config it cuts to and whose redo lowers it."""

    def __init__(self, control: RunCore, zero_grad: Callable[[], None]) -> None:
        self._control = control
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
        parts = split_batch(batch, self._control.config.batch_size)
        if len(parts) == 1:
            return [(batch, 1.0)]
        self._control.redo.split_batches += 1
        total = count_samples(batch)
        return [(part, count_samples(part) / total) for part in parts]

    def lowered(self, exc: BaseException) -> bool:
        """Whether `exc` is an OOM the run recovers from (its config is then lowered)."""
        return self._control.lower_after_oom(exc, self.where)

    def feed(self, batch: Any, context: Any, work: PieceWork) -> list:
        """Add `batch` to the step and run `work` on each of its pieces, recovering from OOMs."""
        self.add(batch, context)
        return self.until_it_fits(lambda: self._work_on(batch, context, work), work)

    def first_piece(self, batch: Any, forward: Callable[[Any], T], work: PieceWork) -> T:
        """The forward of `batch`'s first piece (all of it until an OOM), its loss weighted by the
        piece's share; `backward_and_rest` then runs the other pieces. Only forwards here: after an
        OOM the gradients are whole, and the first piece runs again."""

        def attempt() -> T:
            self.where = "forward"
            pieces = self.pieces(batch)
            piece, weight = pieces[0]
            output = forward(piece)
            if len(pieces) > 1 and output is not None and loss_of(output) is None:
                raise UsageError(_NO_LOSS)
            return weighted(output, weight)

        return self.until_it_fits(attempt, work)

    def backward_and_rest(self, batch: Any, context: Any, loss: torch.Tensor, backward: Callable[[], T],
                          work: PieceWork) -> T:
        """`backward()` of the first piece's `loss`, then `work` on `batch`'s other pieces. `loss` is the
        framework's: it cannot be computed again, so an OOM redoes the step so far."""
        self.add(batch, context)

        def attempt() -> T:
            self.where = "backward"
            result = backward()
            for piece, weight in self.pieces(batch)[1:]:
                work(piece, weight, context)
            return result

        return self.until_it_fits(attempt, work, loss=loss)

    def whole_piece(self, piece: Any, weight: float, forward: Callable[[Any], Any],
                    backward: Callable[[torch.Tensor], Any]) -> None:
        """One piece of a micro-batch, forward and backward, its loss weighted by its share."""
        self.where = "forward"
        loss = loss_of(forward(piece))
        if loss is None:
            raise UsageError(_NO_LOSS)
        self.where = "backward"
        backward(loss * weight)

    def until_it_fits(self, attempt: Callable[[], T], work: PieceWork, *, loss: torch.Tensor | None = None) -> T | list:
        """`attempt()` (the work on the micro-batch last added), again after each OOM until it fits.

        After an OOM in a forward, `attempt` runs again at the lowered micro-batch; after one in a
        backward (or in a redone step), the gradients are zeroed and every micro-batch of the step so
        far is fed again, piece by piece, and the results of the last one's pieces are returned.
        `loss`: computed before `attempt`, whose backward is part of it; it cannot be computed again,
        so any OOM redoes the whole step, its graph dropped first (the framework still holds it)."""
        redoing_step = loss is not None

        def after_oom(exc: Exception) -> Callable[[], Any] | None:
            nonlocal redoing_step
            if not self.lowered(exc):
                return None
            if loss is not None:
                drop_graph(loss)
            if self.where == "forward" and not redoing_step:
                return attempt  # the gradients are whole: this micro-batch again, in pieces
            self._zero_grad()
            redoing_step = True
            return lambda: self._whole_step(work)

        return self._control.redo.until_it_fits(attempt, after_oom)

    def _work_on(self, batch: Any, context: Any, work: PieceWork) -> list:
        return [work(piece, weight, context) for piece, weight in self.pieces(batch)]

    def _whole_step(self, work: PieceWork) -> list:
        results: list = []
        for batch, context in self._step:
            results = self._work_on(batch, context, work)
        return results
