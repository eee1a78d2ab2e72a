"""A config's memory before a probe spends it: the user's function run on fake tensors in a process of
its own (`Estimator`), the peak split into parts, a search space's configs estimated between a search's
probes (`SpaceEstimation`), the answers as a study keeps them (`StoredEstimates`, `stored_estimates`)
and turned into the planner's MemoryPrediction with each device's peak factors (`peak_factors`), and
`autofit estimate`'s answer to "what fits on a card of each size" (`WhatFits`). Predictions anchored
on measured peaks are the planner's (autofit.planner), since they reason over its observations."""

from __future__ import annotations

from autofit.memory._estimator import (
    CUDA_CONTEXT_BYTES,
    PARTS,
    Estimates,
    Estimator,
    MemoryEstimate,
    estimate_memory,
)
from autofit.memory._peak_factors import (
    CPU_FACTORS,
    CPU_TYPICAL_FACTOR,
    CUDA_FACTORS,
    CUDA_TYPICAL_FACTOR,
    peak_factors,
)
from autofit.memory._space_estimation import ENDED_FIRST, SpaceEstimation
from autofit.memory._stored_estimates import StoredEstimates, stored_estimates
from autofit.memory._what_fits import ALLOCATOR_OVERHEAD, GPU_PREFERENCE, Fit, WhatFits

__all__ = [
    "ALLOCATOR_OVERHEAD",
    "CPU_FACTORS",
    "CPU_TYPICAL_FACTOR",
    "CUDA_CONTEXT_BYTES",
    "CUDA_FACTORS",
    "CUDA_TYPICAL_FACTOR",
    "ENDED_FIRST",
    "GPU_PREFERENCE",
    "PARTS",
    "Estimates",
    "Estimator",
    "Fit",
    "MemoryEstimate",
    "SpaceEstimation",
    "StoredEstimates",
    "WhatFits",
    "estimate_memory",
    "peak_factors",
    "stored_estimates",
]
