"""A config's memory before a probe spends it: the user's function run on fake tensors in a process of
its own (`Estimator`), the peak split into parts, and `autofit estimate`'s answer to "what fits on a
card of each size" (`WhatFits`). Predictions anchored on measured peaks are the planner's
(autofit.planner), since they reason over its observations."""

from __future__ import annotations

from autofit.memory._estimator import (
    CUDA_CONTEXT_BYTES,
    PARTS,
    Estimates,
    Estimator,
    MemoryEstimate,
    estimate_memory,
)
from autofit.memory._what_fits import ALLOCATOR_OVERHEAD, GPU_PREFERENCE, Fit, WhatFits

__all__ = [
    "ALLOCATOR_OVERHEAD",
    "CUDA_CONTEXT_BYTES",
    "GPU_PREFERENCE",
    "PARTS",
    "Estimates",
    "Estimator",
    "Fit",
    "MemoryEstimate",
    "WhatFits",
    "estimate_memory",
]
