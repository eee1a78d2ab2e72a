import pytest

from autofit.runtime import is_oom


class OutOfMemoryError(RuntimeError):
    """Same name as torch.OutOfMemoryError."""


@pytest.mark.parametrize("exc", [
    MemoryError(),
    OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"),
    RuntimeError("HIP out of memory. Tried to allocate 1 GiB"),
    RuntimeError("XPU out of memory."),
    RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input."),
    RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 4294967296 bytes."),
])
def test_oom_detected(exc):
    assert is_oom(exc)


@pytest.mark.parametrize("exc", [
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"),
    ValueError("out of memory"),  # not a RuntimeError: a user's own message
    KeyError("memory"),
    RuntimeError("CUDA error: device-side assert triggered"),
])
def test_other_errors_are_not_oom(exc):
    assert not is_oom(exc)


def test_chained_oom_detected():
    try:
        try:
            raise MemoryError()
        except MemoryError as inner:
            raise RuntimeError("wrapper failed") from inner
    except RuntimeError as outer:
        assert is_oom(outer)


def test_real_torch_cpu_oom_is_detected():
    torch = pytest.importorskip("torch")
    try:
        torch.empty(2**62, dtype=torch.uint8)
    except BaseException as exc:  # noqa: BLE001
        assert is_oom(exc)
    else:
        pytest.fail("allocating 4 EiB should have failed")


def test_a_onednn_primitive_failure_is_oom_only_under_a_memory_cap():
    """oneDNN reports a refused scratchpad as "could not create a primitive"; without autofit's cap
    the same message is some other fault and must not be retried as OOM."""
    import subprocess
    import sys

    script = (
        "import resource\n"
        "from autofit.runtime import is_oom\n"
        "exc = RuntimeError('could not create a primitive')\n"
        "print(is_oom(exc))\n"
        "resource.setrlimit(resource.RLIMIT_DATA, (8 << 30, resource.RLIM_INFINITY))\n"
        "print(is_oom(exc))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
