"""How many bytes of a device's peak each tensor byte the estimator counts costs, per device: the
priors that turn the estimator's bytes into the planner's MemoryPrediction, until probes measure the
factor of a script (autofit.planner's CalibratedPrediction)."""

from __future__ import annotations

#: Peak bytes per tensor byte the estimator counts, before any probe measures it.
CPU_FACTORS = (1.0, 2.5)
#: ... and the typical one, for the raw prediction (`MemoryPrediction.raw_peak`): glibc's heap keeps
#: the holes freed tensors leave, so a CPU process's peak holds more than its live tensors: 1.4-2.5x
#: on the corpus, by the script's pattern of allocations (benchmarks/estimates-in-search.md). One
#: factor cannot follow that spread; probes calibrate it per script.
CPU_TYPICAL_FACTOR = 1.8
#: On a GPU: the caching allocator's rounding and fragmentation (not yet checked on a real GPU).
CUDA_TYPICAL_FACTOR = 1.1
#: On a GPU the estimate (fake tensors on the CPU with CUDA's attention and optimizer kernels, but no
#: cuDNN algorithms' workspaces and the CPU autocast's op list) can run high or low: GPT-2 small's H100
#: peaks were 0.95-1.11x the raw prediction (tests/unit/memory/test_cuda_target.py).
CUDA_FACTORS = (0.6, 1.6)


def peak_factors(device: str) -> dict[str, tuple[float, float] | float]:
    """The factor range and the typical factor of a device type ("cpu", "cuda"), as MemoryPrediction's
    keyword arguments."""
    on_gpu = device == "cuda"
    return {"factors": CUDA_FACTORS if on_gpu else CPU_FACTORS,
            "typical_factor": CUDA_TYPICAL_FACTOR if on_gpu else CPU_TYPICAL_FACTOR}
