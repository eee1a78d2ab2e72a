"""Whether the installed PyTorch can use the GPUs NVML sees, and the one-line fix when it cannot.

NVML is the driver's library: it lists a GPU whatever torch was built for. The commonest first mistake on a
GPU machine is an environment whose torch is a CPU-only build (`torch.__version__` ending in `+cpu`), or a
CUDA build newer than the driver: NVML then lists the GPU and torch cannot use it. `autofit devices` shows
both views and fails with the fix; a normal run that falls back to the CPU says why in its first line.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from autofit.devices._base import DeviceInfo

#: PyTorch's own install selector: the command for a CUDA build on this system.
INSTALL_URL = "https://pytorch.org/get-started/locally/"


@dataclass(frozen=True)
class TorchView:
    """What the installed torch says of the GPUs."""

    version: str
    cuda: str | None
    """The CUDA (or ROCm) version torch was built for; None: a CPU-only build."""
    available: bool
    """`torch.cuda.is_available()`: torch can use a GPU."""
    count: int = 0
    """The GPUs torch can use."""

    @classmethod
    def of(cls, torch: ModuleType | None = None) -> TorchView:
        """The view of `torch` (imported here when not given)."""
        if torch is None:
            import torch
        version = getattr(torch, "version", None)
        built = getattr(version, "cuda", None) or getattr(version, "hip", None)
        available = bool(torch.cuda.is_available())
        return cls(version=str(torch.__version__), cuda=str(built) if built else None, available=available,
                   count=int(torch.cuda.device_count()) if available else 0)

    def describe(self) -> str:
        """'torch 2.5.1+cu124 (built for CUDA 12.4): 1 GPU usable', or '... a CPU-only build (no CUDA)'."""
        gpus = f"{self.count} GPU{'s' if self.count != 1 else ''} usable" if self.available else "no usable GPU"
        if self.cuda is None:
            return f"torch {self.version}: a CPU-only build (no CUDA)" if not self.available else \
                f"torch {self.version}: {gpus}"
        return f"torch {self.version} (built for CUDA {self.cuda}): {gpus}"


def gpu_problem(gpus: list[DeviceInfo], view: TorchView, driver_cuda: str | None = None) -> str | None:
    """Why torch cannot use the GPUs NVML sees, with what to do, in one sentence; None where it can use
    one or NVML sees none. `driver_cuda`: the newest CUDA the driver runs, where NVML says
    (autofit.devices._cuda.driver_cuda_version)."""
    if not gpus or view.available:
        return None
    seen = f"the {gpus[0].name} NVML sees" + (f" (and {len(gpus) - 1} more)" if len(gpus) > 1 else "")
    if view.cuda is None:
        return (f"torch {view.version} is a CPU-only build, so it cannot use {seen}: install PyTorch's CUDA build "
                f"into this environment (the command for your system: {INSTALL_URL})")
    newest = f"; the driver runs CUDA {driver_cuda} at most" if driver_cuda else ""
    return (f"torch {view.version} is built for CUDA {view.cuda}, but it cannot use {seen}{newest}: install the "
            f"PyTorch build for your driver's CUDA ({INSTALL_URL}) or a newer NVIDIA driver, and check that "
            f"CUDA_VISIBLE_DEVICES does not hide the GPU")

