"""Device backends behind one contract (`DeviceBackend`): `cpu` (a real RLIMIT_DATA cap) and `cuda`
(NVML and torch.cuda). The worker makes one with `make_backend`; nothing else imports a backend."""

from __future__ import annotations

from autofit.devices._allocator import (
    DEFAULT_CUDA_ALLOC_CONF,
    allocator_difference,
    apply_allocator_settings,
    current_allocator_settings,
    probe_alloc_conf,
)
from autofit.devices._base import DeviceBackend, DeviceInfo, check_memory_limit, default_memory_limit
from autofit.devices._cpu import available_memory_bytes, cpu_has_native_bf16
from autofit.devices._cuda import driver_cuda_version
from autofit.devices._peak_flops import PEAK_FLOPS, PeakFlops, mfu, peak_flops_for, peak_flops_per_s
from autofit.devices._select import (
    DEVICE_ENV,
    DEVICE_TYPES,
    check_device,
    default_device,
    default_device_line,
    list_devices,
    make_backend,
)
from autofit.devices._torch_gpu import INSTALL_URL, TorchView, gpu_problem

__all__ = [
    "DEFAULT_CUDA_ALLOC_CONF",
    "apply_allocator_settings",
    "probe_alloc_conf",
    "INSTALL_URL",
    "TorchView",
    "gpu_problem",
    "DEVICE_ENV",
    "DEVICE_TYPES",
    "default_device",
    "default_device_line",
    "PEAK_FLOPS",
    "PeakFlops",
    "DeviceBackend",
    "DeviceInfo",
    "allocator_difference",
    "available_memory_bytes",
    "check_device",
    "check_memory_limit",
    "default_memory_limit",
    "driver_cuda_version",
    "cpu_has_native_bf16",
    "current_allocator_settings",
    "list_devices",
    "make_backend",
    "mfu",
    "peak_flops_per_s",
    "peak_flops_for",
]
