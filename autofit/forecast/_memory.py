"""The largest micro-batch of a strategy that fits a target GPU, never one that would run out of memory.

A strategy's peak grows with the micro-batch along a line; measured peaks give it. With two micro-batches
or more, the slope is the steepest between neighbours and the line passes through or above every peak;
with one, all of the peak is assumed to grow with the micro-batch (no fixed part), which over-states
every larger one: a fit is then smaller than it could be, never too big. The peaks are the allocator's,
as the search compared them with its usable memory; on the target the usable memory is its total less
the same headroom, and less the CUDA context that the allocator's peak does not count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The CUDA context (driver, kernels, cuBLAS workspace) beside the allocator's peak: about 0.47 GiB on an
#: H100 with torch 2.11 (its OOM message's capacity, 79.18 GiB, against the 79.65 GiB total); rounded up.
CONTEXT_BYTES = 512 * 1024**2


@dataclass(frozen=True)
class MemoryLine:
    """peak = intercept + slope x micro-batch, from `points` measured peaks; `basis` says how."""

    slope: float
    intercept: float
    points: int

    @property
    def basis(self) -> str:
        if self.points >= 2:
            return f"the slope of {self.points} measured peaks"
        return "one measured peak: all of it assumed to grow with the micro-batch (an upper bound)"

    def peak(self, batch_size: int) -> float:
        return self.intercept + self.slope * batch_size

    @classmethod
    def through(cls, peaks: dict[int, float]) -> MemoryLine:
        """The line over `peaks` (micro-batch to measured peak bytes)."""
        sizes = sorted(peaks)
        if len(sizes) == 1:
            return cls(slope=peaks[sizes[0]] / sizes[0], intercept=0.0, points=1)
        slope = max((peaks[b] - peaks[a]) / (b - a) for a, b in zip(sizes, sizes[1:], strict=False))
        slope = max(slope, 0.0)
        intercept = max(peaks[b] - slope * b for b in sizes)
        return cls(slope=slope, intercept=intercept, points=len(sizes))


def usable_bytes(total_bytes: float, headroom: float) -> float:
    """What a config may take on a target: its total less the headroom, less the CUDA context."""
    return total_bytes * (1 - headroom) - CONTEXT_BYTES


def largest_fit(line: MemoryLine, usable: float, global_batch: int | None, cap: int | None = None) -> int:
    """The largest micro-batch whose predicted peak is within `usable` and that divides `global_batch`
    (the same optimizer step), at most `cap`; 0 when not even one sample fits."""
    if line.slope <= 0:
        most = cap or global_batch or 1
    else:
        most = math.floor((usable - line.intercept) / line.slope)
    if cap is not None:
        most = min(most, cap)
    if global_batch:
        most = min(most, global_batch)
        while most > 0 and global_batch % most:
            most -= 1
    return max(most, 0)
