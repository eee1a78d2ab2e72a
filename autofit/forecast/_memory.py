"""The largest micro-batch of a strategy that fits a target GPU, never one that would run out of memory.

A strategy's peak grows with the micro-batch along a line; measured peaks give it. With two micro-batches
or more, the slope is the steepest between neighbours and the line passes through or above every peak.
With one, how much of the peak is fixed is unknown, so it is bounded both ways: above the measured
micro-batch all of it grows with the micro-batch, below it none of it shrinks; or, where a study kept the
memory estimator's answers, it moves by the estimator's per-sample bytes times the device's largest
peak factor above, and its smallest below. Each bound over-states the peak on its side: a fit is then
smaller than it could be, never too big. The peaks are the allocator's, as the search compared them with
its usable memory; on the target the usable memory is its total less the same headroom, and less the CUDA
context that the allocator's peak does not count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The CUDA context (driver, kernels, cuBLAS workspace) beside the allocator's peak: about 0.47 GiB on an
#: H100 with torch 2.11 (its OOM message's capacity, 79.18 GiB, against the 79.65 GiB total); rounded up.
CONTEXT_BYTES = 512 * 1024**2


@dataclass(frozen=True)
class MemoryLine:
    """peak(b) = the largest of `lines` (intercept, slope) at micro-batch b; `basis` says where they come from."""

    lines: tuple[tuple[float, float], ...]
    basis: str

    @property
    def slope(self) -> float:
        return max(slope for _, slope in self.lines)

    def peak(self, batch_size: int) -> float:
        return max(intercept + slope * batch_size for intercept, slope in self.lines)

    @classmethod
    def through(cls, peaks: dict[int, float], per_sample: tuple[float, float] | None = None) -> MemoryLine:
        """The line over `peaks` (micro-batch to measured peak bytes); with one peak, `per_sample`: the
        estimator's (low, high) peak bytes per sample of the strategy, where a study has them."""
        sizes = sorted(peaks)
        if len(sizes) >= 2:
            slope = max(0.0, *((peaks[b] - peaks[a]) / (b - a) for a, b in zip(sizes, sizes[1:], strict=False)))
            intercept = max(peaks[b] - slope * b for b in sizes)
            return cls(((intercept, slope),), f"the slope of {len(sizes)} measured peaks")
        (b0,), p0 = sizes, peaks[sizes[0]]
        if per_sample is None:
            return cls(((0.0, p0 / b0), (p0, 0.0)),
                       f"one measured peak (b={b0}): all of it assumed to grow above b={b0}, none to shrink below")
        low, high = per_sample
        return cls(((p0 - high * b0, high), (p0 - low * b0, low)),
                   f"one measured peak (b={b0}) and the memory estimator's bytes per sample")


def usable_bytes(total_bytes: float, headroom: float) -> float:
    """What a config may take on a target: its total less the headroom, less the CUDA context."""
    return total_bytes * (1 - headroom) - CONTEXT_BYTES


def largest_fit(line: MemoryLine, usable: float, global_batch: int | None, cap: int | None = None) -> int:
    """The largest micro-batch whose predicted peak is within `usable` and that divides `global_batch`
    (the same optimizer step), at most `cap`; 0 when not even one sample fits."""
    most = cap or global_batch or 1 << 20
    for intercept, slope in line.lines:
        if slope > 0:
            most = min(most, math.floor((usable - intercept) / slope))
        elif intercept > usable:
            return 0
    if global_batch:
        most = min(most, global_batch)
        while most > 0 and global_batch % most:
            most -= 1
    return max(most, 0)
