"""Is this exception an out-of-memory? Anything else is the user's error, never retried as OOM."""

from __future__ import annotations

# Substrings of the RuntimeError messages that mean the allocator ran dry (see ANCHORS.md).
_OOM_MESSAGES = (
    "out of memory",  # CUDA ("CUDA out of memory"), HIP, XPU, MPS
    "DefaultCPUAllocator: can't allocate memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED",  # what cuDNN says when its workspace would not fit
    "CUBLAS_STATUS_ALLOC_FAILED",
    "PT_DEVMEM Allocation failed",  # Habana
)


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
        return any(pattern in message for pattern in _OOM_MESSAGES)
    return False
