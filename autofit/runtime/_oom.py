"""Is this exception an out-of-memory? Anything else is the user's error, never retried as OOM."""

from __future__ import annotations

import resource

# Substrings of the RuntimeError messages that mean the allocator ran dry (see ANCHORS.md).
_OOM_MESSAGES = (
    "out of memory",  # CUDA ("CUDA out of memory"), HIP, XPU, MPS
    "DefaultCPUAllocator: can't allocate memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED",  # what cuDNN says when its workspace would not fit
    "CUBLAS_STATUS_ALLOC_FAILED",
    "PT_DEVMEM Allocation failed",  # Habana
)

# oneDNN (mkldnn) turns every failure to create a primitive into this one message, its status lost;
# a primitive allocates its scratchpad when it is created, so under autofit's CPU cap (RLIMIT_DATA)
# this is the allocator refusing memory. Seen in CI: an fp32 Linear backward on an Intel CPU.
_ONEDNN_MESSAGES = ("could not create a primitive",)


def _under_a_cpu_memory_cap() -> bool:
    """True when this process's private memory is capped (autofit's CPU backend sets RLIMIT_DATA)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    return soft != resource.RLIM_INFINITY


def is_oom(exc: BaseException) -> bool:
    """True for torch.OutOfMemoryError, MemoryError and allocator RuntimeErrors, also when chained."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _is_oom_here(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _is_oom_here(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError without importing torch
        return True
    if isinstance(exc, RuntimeError):
        message = str(exc)
        if any(pattern in message for pattern in _OOM_MESSAGES):
            return True
        return any(pattern in message for pattern in _ONEDNN_MESSAGES) and _under_a_cpu_memory_cap()
    return False


# Errors after which CUDA's documentation says the context is corrupted ("sticky" errors): every
# later call in the process fails, so the process must be replaced, never reused.
_STICKY_CUDA_MESSAGES = (
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
    "an illegal",  # "an illegal memory access was encountered", "an illegal instruction ..."
    "CUDA error: ",  # any other CUDA runtime error reported by PyTorch's C10_CUDA_CHECK
    "CUBLAS_STATUS_EXECUTION_FAILED",
    "CUDNN_STATUS_EXECUTION_FAILED",
)


def breaks_the_device(exc: BaseException) -> bool:
    """True for a non-OOM CUDA error (torch.AcceleratorError, "CUDA error: ...", a device-side
    assert): the CUDA context is broken and the process that holds it must not run another probe."""
    if is_oom(exc):
        return False
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__name__ == "AcceleratorError":
            return True
        if isinstance(current, RuntimeError) and any(p in str(current) for p in _STICKY_CUDA_MESSAGES):
            return True
        current = current.__cause__ or current.__context__
    return False
