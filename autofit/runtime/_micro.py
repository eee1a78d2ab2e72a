"""`MicroBatch`: a batch as a run's loop hands it out, with what cutting it needs. For batches by tokens:
its real tokens, its samples' lengths and the length they are padded to, so that a piece cut from it
(after an out-of-memory, or by the token guard) knows its own tokens and the width it still runs at."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autofit.runtime._batch import batch_len, count_samples, split_batch


@dataclass(frozen=True)
class MicroBatch:
    """A batch; for batches by tokens, its real tokens, its samples' lengths in its order (None where they
    do not line up with its samples: a collate_fn that does not keep one row per sample) and its padded
    width (a piece cut from it keeps it: the cut is along the samples)."""

    batch: Any
    real_tokens: int | None = None
    lengths: tuple[int, ...] | None = None
    width: int = 0

    @classmethod
    def of_tokens(cls, batch: Any, lengths: tuple[int, ...], width: int | None = None) -> MicroBatch:
        """A TokenLoader's batch and its samples' lengths (its `batch_lengths`), padded to `width` (its
        `batch_width`; None: the longest)."""
        aligned = batch_len(batch) == len(lengths)
        return cls(batch, sum(lengths), lengths if aligned else None, width or max(lengths, default=0))

    @property
    def samples(self) -> int:
        return count_samples(self.batch)

    def cut(self, size: int) -> list[MicroBatch]:
        """Pieces of `size` samples (views), each with its own samples' tokens (by its share of the
        samples where the lengths are unknown); itself alone when it holds at most `size`."""
        parts = split_batch(self.batch, size)
        if len(parts) == 1:
            return [self]
        if self.real_tokens is None:
            return [MicroBatch(part) for part in parts]
        if self.lengths is not None:
            shares = [self.lengths[start:start + size] for start in range(0, len(self.lengths), size)]
            return [MicroBatch(part, sum(share), share, self.width) for part, share in zip(parts, shares, strict=True)]
        total = self.samples
        return [MicroBatch(part, round(self.real_tokens * count_samples(part) / total), None, self.width)
                for part in parts]

    def share_of(self, whole: MicroBatch) -> float:
        """This piece's share of `whole`, the micro-batch it was cut from: by real tokens (samples where
        they are unknown), what its loss, a mean over its own tokens, counts for in the whole's."""
        if self is whole:
            return 1.0
        if whole.real_tokens:
            return (self.real_tokens or 0) / whole.real_tokens
        return self.samples / whole.samples
