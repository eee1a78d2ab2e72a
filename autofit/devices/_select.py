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
            raise UsageError("The device cuda was asked for, but no NVIDIA GPU is visible (NVML found none): check the "
                             "driver with nvidia-smi (a container needs the GPUs passed in, e.g. docker run --gpus "
                             "all), or leave out --gpu and --device cuda to probe the CPU.")
        if not 0 <= index < len(gpus):
            raise UsageError(f"The GPU index must be in 0..{len(gpus) - 1}, but got {index}.")
        return gpus[index]
    raise UsageError(f"The device must be one of {', '.join(DEVICE_TYPES)}, but got {device_type!r}.")


#: Where a normal run trains (`python train.py`): the same variable names the device a search probes by default.
DEVICE_ENV = "AUTOFIT_DEVICE"
#: Why the CPU, when it is for want of a GPU (the one reason no line is said for).
NO_GPU = "no GPU is visible"


def default_device() -> tuple[str, int, str]:
    """The device a search probes and a normal run trains on when none is named, its index, and why, in
    words: $AUTOFIT_DEVICE where set (any case: `CUDA:1` is `cuda:1`), else the first GPU NVML sees, else the
    CPU. The one answer for every entry point (the command line, `train.search()`, a normal call, a script's
    `autofit.start`), so that a search writes the file a normal run reads. Never imports torch; where torch is
    imported already (a normal run) and cannot use the GPU NVML sees, the CPU, where that run trains, and the
    why says what to install."""
    import os
    import sys

    named = os.environ.get(DEVICE_ENV, "").strip()
    if named:
        kind, _, index = named.lower().partition(":")
        if kind not in DEVICE_TYPES or (index and not index.isdigit()):
            raise UsageError(f"{DEVICE_ENV} must name a device (cpu, cuda or cuda:N), but got {named!r}.")
        return kind, int(index or 0), f"${DEVICE_ENV}={named}"
    from autofit.devices._cuda import cuda_devices, driver_cuda_version

    gpus = cuda_devices()
    if gpus:
        torch = sys.modules.get("torch")
        if torch is not None:
            from autofit.devices._torch_gpu import TorchView, gpu_problem

            problem = gpu_problem(gpus, TorchView.of(torch), driver_cuda_version())
            if problem:
                return "cpu", 0, problem
        return "cuda", 0, "a GPU is visible"
    return "cpu", 0, NO_GPU


def default_device_line(kind: str, index: int, why: str, given: str, cpu: str) -> str | None:
    """The one line that says where a command probes when no device was `given` (a flag's or a keyword's
    name; `cpu`: how to ask for the CPU instead); None where the CPU was chosen for want of a GPU."""
    if kind == "cpu" and why == NO_GPU:
        return None
    if kind == "cuda" and not why.startswith("$"):
        why += ", where `python train.py` trains"
    return f"autofit: no {given} given: probing {kind}:{index} ({why})" + (f"; {cpu} probes the CPU" if kind != "cpu"
                                                                           else "")
