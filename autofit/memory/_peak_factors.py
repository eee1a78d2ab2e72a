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
#: On a GPU, the caching allocator's rounding and caching over the tensors (a probe's peak is its reserved
#: memory and the context, autofit.devices' cuda backend): the peaks of the repo's GPU logs were 1.01-1.05x
#: the tensors a config estimates (over the 768 MiB context) for GPT-2 small and medium, and 1.20x with
#: activation offload, whose blocks' forward frees segments that the loss head's larger tensors cannot reuse
#: (tests/unit/memory/test_cuda_target.py). One typical factor meets them all within 10%...
CUDA_TYPICAL_FACTOR = 1.1
#: ... and this range holds every one of them with room, so the planner believes it before any probe (the
#: pilot is the largest micro-batch whose high end fits: `MemoryPrediction.trusted`).
CUDA_FACTORS = (0.95, 1.25)


def peak_factors(device: str) -> dict[str, tuple[float, float] | float | bool]:
    """The factor range and the typical factor of a device type ("cpu", "cuda"), and whether the range is
    believed before a probe measures it, as MemoryPrediction's keyword arguments."""
    on_gpu = device == "cuda"
    return {"factors": CUDA_FACTORS if on_gpu else CPU_FACTORS,
            "typical_factor": CUDA_TYPICAL_FACTOR if on_gpu else CPU_TYPICAL_FACTOR,
            "trusted": on_gpu}
