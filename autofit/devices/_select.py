"""Which backend a device name means, and which devices this machine has."""

from __future__ import annotations

from autofit.devices._base import DeviceBackend, DeviceInfo
from autofit.errors import UsageError

DEVICE_TYPES = ("cpu", "cuda")


def make_backend(device_type: str, index: int = 0) -> DeviceBackend:
    """The backend for `device_type` inside the worker process."""
    if device_type == "cpu":
        from autofit.devices._cpu import CpuBackend

        return CpuBackend(index)
    if device_type == "cuda":
        from autofit.devices._cuda import CudaBackend

        return CudaBackend(index)
    raise UsageError(f"The device must be one of {', '.join(DEVICE_TYPES)}, but got {device_type!r}.")


def list_devices() -> list[DeviceInfo]:
    """Every device autofit can probe on, without importing torch."""
    from autofit.devices._cpu import cpu_info
    from autofit.devices._cuda import cuda_devices

    return [cpu_info(), *cuda_devices()]


def check_device(device_type: str, index: int = 0) -> DeviceInfo:
    """The device's info, or a UsageError saying why it cannot be used."""
    if device_type == "cpu":
        from autofit.devices._cpu import cpu_info

        return cpu_info(index)
    if device_type == "cuda":
        from autofit.devices._cuda import cuda_devices

        gpus = cuda_devices()
        if not gpus:
            raise UsageError("The device cuda was asked for, but no NVIDIA GPU is visible (NVML found none).")
        if not 0 <= index < len(gpus):
            raise UsageError(f"The GPU index must be in 0..{len(gpus) - 1}, but got {index}.")
        return gpus[index]
    raise UsageError(f"The device must be one of {', '.join(DEVICE_TYPES)}, but got {device_type!r}.")
