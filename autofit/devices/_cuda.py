"""CUDA backend: a memory limit enforced by PyTorch's caching allocator, counted like the GPU counts it.

What is counted, precisely:
- used memory is everything this process holds on the GPU: PyTorch's reserved memory
  (`torch.cuda.memory_reserved`: allocated tensors plus the allocator's cache) plus the overhead
  outside the allocator (CUDA context, loaded kernels, cuBLAS/cuDNN handles and workspaces).
- the overhead is NVML's per-process used memory for this pid
  (`nvmlDeviceGetComputeRunningProcesses`) less `memory_reserved`. Where NVML cannot report it
  (containers with their own pid namespace, drivers that hide per-process usage) it falls back to
  the device-wide used memory (`total - free` of `torch.cuda.mem_get_info`) less `memory_reserved`,
  which also counts other processes on the same GPU: the limit is then conservative.
- the cap: `apply_memory_limit(budget)` measures the overhead right then and caps the caching
  allocator with `torch.cuda.set_per_process_memory_fraction((usable - overhead) / total)`, where
  usable is the limit less the search's headroom. Capping at the usable memory, not the limit, is the
  one rule that makes "fits" mean one thing: the allocator may cache, split and retry only inside
  what a config is allowed to use, so cached-but-free blocks can neither make a fitting config look
  too big nor let a config pass whose working set only fits by spilling into the headroom. A config
  that needs more raises `torch.OutOfMemoryError` in the probe (status oom).
  Overhead that appears later (handles and kernels loaded at first use) is taken into account again
  at every `reset_peak`, which re-derives the fraction from the overhead measured then.
  A limit above the card's memory is refused (`check_memory_limit`): fit would be judged against memory
  the card does not have.
- the peak is `torch.cuda.max_memory_reserved()` since `reset_peak` plus the overhead measured when
  `peak_bytes` is called: the quantity the cap bounds. Fragmentation inside the allocator counts,
  as it does for a real OOM.
- "only just fits": the allocator's `num_alloc_retries` (reset per probe) counts the times it had to
  free its cache and retry an allocation to stay under the cap. A probe with retries in its measured
  steps ran, but at the edge: it says so, it loses near-ties to configs that did not need to, and the
  climb takes it for the memory edge (`alloc_retries`, read where measuring starts and ends).
- pinned host memory (an activation offload's copies, pinned batches): torch's host allocator keeps it
  cached once freed. Its peak is kept with the probe (`host_pinned_peak_bytes`), and `release` gives
  the cache back, so a kept worker holds no pinned memory between probes.

Device indices are CUDA's (what `torch.device("cuda", i)` means). NVML numbers GPUs in PCI bus
order and ignores CUDA_VISIBLE_DEVICES, so the listing maps them: plain integers are NVML indices;
UUIDs (GPU-..., and MIG-... for a MIG slice) are looked up with `nvmlDeviceGetHandleByUUID`, so a
MIG slice is listed with its own name and memory, which is what the process can use and what the
default limit is. CUDA itself orders GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, so on a
machine with mixed GPU models the two orders differ: the backend, once CUDA is up, finds its GPU in
NVML by the UUID CUDA gives it (`get_device_properties(i).uuid`), never by position; the listing,
which runs without torch, can only assume PCI order (set CUDA_DEVICE_ORDER=PCI_BUS_ID there).
"""

from __future__ import annotations

import gc
import os
from types import ModuleType
from typing import TYPE_CHECKING, Any

from autofit.devices._base import DeviceBackend, DeviceInfo, check_memory_limit
from autofit.devices._peak_flops import peak_flops_per_s
from autofit.devices._torch_gpu import TorchView, gpu_problem
from autofit.errors import UsageError
from autofit.units import format_size

if TYPE_CHECKING:
    import torch

    from autofit.export import MemoryBudget


def _load_nvml() -> ModuleType | None:
    """pynvml, or None when the package is missing (listing then finds no GPU)."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def _nvml_errors(nvml: ModuleType) -> tuple[type[BaseException], ...]:
    """The exceptions pynvml raises for a driver or library problem."""
    errors: list[type[BaseException]] = [OSError]
    for name in ("NVMLError", "NVMLLibraryMismatchError"):
        cls = getattr(nvml, name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            errors.append(cls)
    return tuple(errors)


def _decode(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def visible_physical_indices(count: int) -> list[int] | None:
    """NVML indices of the GPUs CUDA sees, in CUDA order; None when CUDA_VISIBLE_DEVICES is unset
    or names devices by UUID (those are mapped by `_visible_handles`).

    Follows CUDA's rules: a negative or out-of-range entry ends the list, a repeated one hides all.
    """
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    text = value.strip()
    if text.upper().startswith(("GPU-", "MIG-")):
        return None
    indices: list[int] = []
    for token in text.split(","):
        token = token.strip()
        try:
            index = int(token)
        except ValueError:
            break  # CUDA stops at the first entry it cannot parse
        if index < 0 or index >= count:
            break
        if index in indices:
            return []
        indices.append(index)
    return indices


def _visible_uuids() -> list[str] | None:
    """The UUIDs in CUDA_VISIBLE_DEVICES, in order, when it names devices by UUID; else None."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None or not value.strip().upper().startswith(("GPU-", "MIG-")):
        return None
    uuids: list[str] = []
    for token in value.split(","):
        token = token.strip()
        if not token.upper().startswith(("GPU-", "MIG-")):
            break  # CUDA stops at the first entry it cannot parse
        if token in uuids:
            return []
        uuids.append(token)
    return uuids


def _visible_handles(nvml: ModuleType) -> list[Any]:
    """NVML handles of the devices CUDA sees, in CUDA's order (GPUs or MIG slices)."""
    uuids = _visible_uuids()
    if uuids is not None:
        handles = []
        for uuid in uuids:
            try:
                handles.append(nvml.nvmlDeviceGetHandleByUUID(uuid))
            except _nvml_errors(nvml):
                break  # an unknown UUID ends CUDA's list too
        return handles
    visible = visible_physical_indices(nvml.nvmlDeviceGetCount())
    physical = list(range(nvml.nvmlDeviceGetCount())) if visible is None else visible
    return [nvml.nvmlDeviceGetHandleByIndex(p) for p in physical]


def _handle(nvml: ModuleType, index: int) -> Any:
    """The NVML handle of CUDA device `index`."""
    handles = _visible_handles(nvml)
    if not 0 <= index < len(handles):
        raise UsageError(
            f"The GPU index must be below the {len(handles)} GPU(s) CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r} leaves visible, but got {index}."
        )
    return handles[index]


def _by_uuid(nvml: ModuleType, uuid: str | None) -> Any:
    """The NVML handle of the GPU or MIG slice CUDA knows by `uuid`; None when NVML knows neither."""
    if not uuid:
        return None
    named = uuid.upper().startswith(("GPU-", "MIG-"))  # CUDA's string has no prefix; NVML's has one
    for candidate in [uuid] if named else ["GPU-" + uuid, "MIG-" + uuid]:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(candidate)
        except _nvml_errors(nvml):
            continue
    return None


def _device_info(nvml: ModuleType, handle: Any, index: int) -> DeviceInfo:
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    return DeviceInfo(
        type="cuda",
        index=index,
        name=_decode(nvml.nvmlDeviceGetName(handle)),
        total_bytes=int(memory.total),
        free_bytes=int(memory.free),
    )


def cuda_devices() -> list[DeviceInfo]:
    """Every NVIDIA GPU CUDA would see, from NVML alone (no torch import, so listing is fast).

    [] when pynvml is missing or NVML cannot start (no driver): "no GPU" is an answer, not an error.
    """
    nvml = _load_nvml()
    if nvml is None:
        return []
    errors = _nvml_errors(nvml)
    try:
        nvml.nvmlInit()
    except errors:
        return []
    try:
        return [_device_info(nvml, handle, index) for index, handle in enumerate(_visible_handles(nvml))]
    except errors:
        return []
    finally:
        try:
            nvml.nvmlShutdown()
        except errors:
            pass


def _host_allocator(call: str) -> Any:
    """One call of torch's pinned host allocator where this torch has it (None where not): its stats and their
    peak (torch.cuda's, 2.7 on), or giving its cache back (torch.accelerator's public call where torch has
    it, 2.13 does; else the one CUDA graphs' own teardown makes)."""
    import torch

    if call == "empty_host_cache":
        function = (getattr(getattr(torch, "accelerator", None), "empty_host_cache", None)
                    or getattr(torch._C, "_host_emptyCache", None))
    else:
        function = getattr(torch.cuda, call, None)
    return function() if function is not None else None


def _allocator_record(stats: dict) -> dict:
    """The allocator's counters a probe keeps, from `torch.cuda.memory_stats` and the host allocator's stats."""
    return {
        "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "num_ooms": int(stats.get("num_ooms", 0)),
        "active_bytes_peak": int(stats.get("active_bytes.all.peak", 0)),
        "reserved_bytes_peak": int(stats.get("reserved_bytes.all.peak", 0)),
        "inactive_split_bytes_peak": int(stats.get("inactive_split_bytes.all.peak", 0)),
        # pinned host blocks held or cached since `reset_peak`, as the host allocator rounds them
        "host_pinned_peak_bytes": int((_host_allocator("host_memory_stats") or {}).get("allocated_bytes.peak", 0)),
        "allocator_settings": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"),
    }


def driver_cuda_version() -> str | None:
    """The newest CUDA the driver runs ('12.2'), from NVML; None where NVML or the query is missing."""
    nvml = _load_nvml()
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
    except (*_nvml_errors(nvml), AttributeError):
        return None
    try:
        version = int(nvml.nvmlSystemGetCudaDriverVersion())  # 12020 for 12.2
        return f"{version // 1000}.{version % 1000 // 10}"
    except (*_nvml_errors(nvml), AttributeError, TypeError, ValueError):
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except (*_nvml_errors(nvml), AttributeError):
            pass


def cuda_available() -> bool:
    """Whether a driver and at least one GPU are present (whether torch was built with CUDA is
    only known once the worker imports it)."""
    return bool(cuda_devices())


def _no_usable_gpu(torch: ModuleType) -> UsageError:
    """The error of a CUDA device asked of a torch that cannot use a GPU, with what to do."""
    why = gpu_problem(cuda_devices(), TorchView.of(torch), driver_cuda_version()) or "check the driver with nvidia-smi"
    return UsageError("The device cuda needs a PyTorch built with CUDA and a working driver, but "
                      f"torch {torch.__version__} reports no usable GPU: {why}; or probe the CPU with --device cpu.")


def _listed_info(backend: CudaBackend) -> DeviceInfo | None:
    """`backend`'s GPU as NVML lists it (`autofit devices`; CUDA's own total is a little less: the driver's
    reserve), or None where NVML cannot say."""
    try:
        nvml, handle = backend._nvml_device()
    except UsageError:
        return None
    try:
        return _device_info(nvml, handle, backend.index)
    except _nvml_errors(nvml):
        return None


class CudaBackend(DeviceBackend):
    """One GPU, capped through PyTorch's caching allocator (see the module docstring for what counts)."""

    type = "cuda"

    def __init__(self, index: int = 0) -> None:
        super().__init__(index)
        self._torch_ready = False
        self._nvml: ModuleType | None = None
        self._nvml_handle: Any = None
        self._nvml_failed = False
        #: Where the last overhead figure came from: "nvml-process" or "device-wide".
        self.overhead_source: str | None = None
        #: What the caching allocator is capped at: the usable memory (see the module docstring).
        self.allocator_cap: int | None = None
        self._device_name: str | None = None  # NVML's name, read once for the peak FLOP/s

    # -- torch and NVML, both lazily -------------------------------------------------------------

    def _cuda(self):
        """torch.cuda, with this device made current (so the CUDA context is created on it)."""
        import torch

        if not self._torch_ready:
            if not torch.cuda.is_available():
                raise _no_usable_gpu(torch)
            torch.cuda.set_device(self.index)
            self._torch_ready = True
        return torch.cuda

    def torch_device(self) -> torch.device:
        import torch

        self._cuda()
        return torch.device("cuda", self.index)

    def _nvml_device(self) -> tuple[ModuleType, Any]:
        """pynvml and the handle of this GPU, or a UsageError that says what NVML answered.

        Once CUDA is up, the handle is the one whose UUID is CUDA's for this device, whatever order
        either numbers GPUs in; before, CUDA_VISIBLE_DEVICES read in NVML's order (`_handle`), which
        is not kept, so that the first call after CUDA starts finds the GPU by its UUID."""
        if self._nvml_handle is not None:
            return self._nvml, self._nvml_handle
        nvml = self._nvml or _load_nvml()
        if nvml is None:
            raise UsageError(
                "The device cuda needs NVML (package nvidia-ml-py) to read GPU memory, but it is not installed."
            )
        try:
            if self._nvml is None:
                nvml.nvmlInit()  # reference-counted; kept open for the worker's lifetime
                self._nvml = nvml
            handle = _by_uuid(nvml, self._cuda_uuid()) if self._torch_ready else None
            if handle is not None:
                self._nvml_handle = handle
                return nvml, handle
            return nvml, _handle(nvml, self.index)
        except _nvml_errors(nvml) as error:
            raise UsageError(
                f"NVML must answer to read GPU {self.index} (is the NVIDIA driver loaded?), but it failed: {error}"
            ) from error

    def _cuda_uuid(self) -> str | None:
        """CUDA's UUID of this device (a GPU's or a MIG slice's), as torch gives it (without NVML's prefix)."""
        uuid = getattr(self._cuda().get_device_properties(self.index), "uuid", None)
        return str(uuid) if uuid else None

    def _process_bytes_from_nvml(self) -> int | None:
        """This process's used GPU memory according to NVML, or None where NVML cannot tell."""
        if self._nvml_failed:
            return None
        try:
            nvml, handle = self._nvml_device()
        except UsageError:
            self._nvml_failed = True
            return None
        try:
            processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except _nvml_errors(nvml):
            return None
        pid = os.getpid()
        used = [getattr(p, "usedGpuMemory", None) for p in processes if getattr(p, "pid", None) == pid]
        if not used or any(u is None for u in used):
            return None  # other pid namespace, or usage hidden by the driver
        return int(sum(used))

    # -- DeviceBackend -----------------------------------------------------------------------------

    def info(self) -> DeviceInfo:
        nvml, handle = self._nvml_device()
        try:
            info = _device_info(nvml, handle, self.index)
        except _nvml_errors(nvml) as error:
            raise UsageError(f"NVML must report GPU {self.index}'s name and memory, but it failed: {error}") from error
        if self._torch_ready:
            # What this process can allocate on (a MIG slice, say), as CUDA itself reports it.
            free, total = self._cuda().mem_get_info(self.index)
            if 0 < int(total) < info.total_bytes:
                info = DeviceInfo(info.type, info.index, info.name, int(total), int(free))
        return info

    def supported_precisions(self) -> tuple[str, ...]:
        cuda = self._cuda()
        precisions = ["fp32"]
        if tuple(cuda.get_device_capability(self.index)) >= (8, 0):
            precisions.append("tf32")  # tensor-core TF32 arrived with Ampere
        try:
            bf16 = cuda.is_bf16_supported(including_emulation=False)  # native only: emulated bf16 is slow
        except TypeError:  # torch before the keyword existed
            bf16 = cuda.is_bf16_supported()
        if bf16:
            precisions.append("bf16")
        precisions.append("fp16")
        return tuple(precisions)

    def default_precisions(self) -> tuple[str, ...]:
        # bf16 first where it runs natively (Ampere on): what an engineer sets by hand on such a GPU.
        supported = self.supported_precisions()
        return tuple(sorted(supported, key=lambda p: p != "bf16"))

    def overhead_bytes(self) -> int:
        """GPU memory this process holds outside PyTorch's allocator, measured now."""
        cuda = self._cuda()
        reserved = int(cuda.memory_reserved(self.index))
        process = self._process_bytes_from_nvml()
        if process is not None:
            self.overhead_source = "nvml-process"
            return max(0, process - reserved)
        free, total = cuda.mem_get_info(self.index)
        self.overhead_source = "device-wide"
        return max(0, int(total) - int(free) - reserved)

    def _set_fraction(self, cap_bytes: int | None, overhead: int) -> float:
        cuda = self._cuda()
        if cap_bytes is None:
            fraction = 1.0
        else:
            _, total = cuda.mem_get_info(self.index)
            fraction = min(1.0, max(0.0, (cap_bytes - overhead) / int(total)))
        cuda.set_per_process_memory_fraction(fraction, self.index)
        return fraction

    def apply_memory_limit(self, budget: MemoryBudget | None) -> None:
        memory_limit, usable_bytes = (budget.limit_bytes, budget.usable_bytes) if budget else (None, None)
        if memory_limit is None:
            self._set_fraction(None, 0)
            self.memory_limit = self.allocator_cap = None
            return
        listed = _listed_info(self)
        if listed is not None:  # the memory `autofit devices` lists, which a search's default limit is
            check_memory_limit(memory_limit, listed, given=None)
        overhead = self.overhead_bytes()
        used = int(self._cuda().memory_reserved(self.index)) + overhead
        if used >= memory_limit:
            raise UsageError(
                f"The memory limit must exceed what the worker needs just to start "
                f"({format_size(used)}: CUDA context, libraries and tensors already on the GPU), "
                f"but got {format_size(memory_limit)}."
            )
        cap = int(min(memory_limit, usable_bytes)) if usable_bytes else memory_limit
        if used >= cap:
            raise UsageError(
                f"The usable memory (the limit less the headroom) must exceed what the worker needs just "
                f"to start ({format_size(used)}), but got {format_size(cap)}: raise the limit or lower --headroom."
            )
        self._set_fraction(cap, overhead)
        self.memory_limit = memory_limit
        self.allocator_cap = cap

    def used_bytes(self) -> int:
        overhead = self.overhead_bytes()
        return int(self._cuda().memory_reserved(self.index)) + overhead

    def reset_peak(self) -> None:
        cuda = self._cuda()
        if self.allocator_cap is not None:
            # Overhead grows as libraries load at first use: re-deduct it so the cap keeps counting it.
            self._set_fraction(self.allocator_cap, self.overhead_bytes())
        cuda.reset_peak_memory_stats(self.index)
        cuda.reset_accumulated_memory_stats(self.index)  # retries and OOMs counted per probe
        _host_allocator("reset_peak_host_memory_stats")

    def peak_bytes(self) -> int:
        overhead = self.overhead_bytes()
        return int(self._cuda().max_memory_reserved(self.index)) + overhead

    def synchronize(self) -> None:
        self._cuda().synchronize(self.index)

    def tensor_bytes(self) -> int:
        return int(self._cuda().memory_allocated(self.index))

    def release(self) -> None:
        """Back to the device all PyTorch can give: tensors held only by reference cycles, cuBLAS's
        workspaces (one per handle and stream, allocated again at the next matmul: torch's own leak
        check clears them too), then the allocator's cached blocks; and back to the host the pinned
        memory torch's host allocator keeps cached (an activation offload's copies, pinned batches)."""
        import torch

        cuda = self._cuda()
        gc.collect()
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:
            clear_workspaces()
        cuda.empty_cache()
        _host_allocator("empty_host_cache")

    def energy_joules(self) -> float | None:
        """NVML's total energy since the driver loaded (millijoules, Volta and later); None where the
        GPU or a MIG slice does not report it."""
        try:
            nvml, handle = self._nvml_device()
        except UsageError:
            return None
        try:
            return int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)) / 1000.0
        except (*_nvml_errors(nvml), AttributeError):
            return None

    def peak_flops_per_s(self, precision: str) -> float | None:
        """The GPU's dense peak (autofit.devices._peak_flops); a MIG slice's scaled by its SMs, as CUDA counts them."""
        if self._device_name is None:
            self._device_name = self.info().name
        multiprocessors = self._cuda().get_device_properties(self.index).multi_processor_count
        return peak_flops_per_s(self._device_name, precision, multiprocessors)

    def _native_count(self, key: str, default: int | None = None) -> int | None:
        """A count of the caching allocator's since `reset_peak` (reset_accumulated_memory_stats); None where it is
        not counted: cudaMallocAsync (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync) keeps no such count."""
        cuda = self._cuda()
        if cuda.get_allocator_backend() != "native":
            return None
        count = cuda.memory_stats(self.index).get(key, default)
        return None if count is None else int(count)

    def allocations(self) -> int | None:
        """Allocations since `reset_peak`: 0 for a probe whose function trained elsewhere (on the CPU, or another
        GPU), whatever its peak (`_native_count`)."""
        return self._native_count("allocation.all.allocated")

    def alloc_retries(self) -> int | None:
        return self._native_count("num_alloc_retries", 0)

    def allocator_stats(self) -> dict:
        return _allocator_record(self._cuda().memory_stats(self.index))

