"""CPU backend: a real memory cap via RLIMIT_DATA, so oversize configs fail in the allocator.

What is counted, precisely:
- the limit is the soft RLIMIT_DATA of the worker process: the kernel refuses any growth of its
  private writable memory (heap and anonymous mappings, where every tensor lives) beyond it, and
  torch's CPU allocator then raises "DefaultCPUAllocator: can't allocate memory". It includes the
  baseline of Python, torch and the user's module, as a GPU's memory includes the CUDA context.
- the peak is the larger of two readings since the probe started: the peak resident set (VmHWM,
  reset through /proc/self/clear_refs) less file-backed resident pages (shared libraries), which
  catches short spikes of touched memory; and VmData, the very quantity the limit caps, sampled
  every few milliseconds by a background thread, which catches memory that is reserved but not
  (yet) touched. Either alone under-reads what the allocator will be refused. The thread sleeps while
  a probe's measured steps are timed (`timing`): its wake-ups took the GIL from the user's step, 4% of
  a host-bound step (benchmarks/fidelity-frameworks.md). Those steps are the warm-up's again, so the
  warm-up's samples and the step counted after them (and VmHWM, which the kernel keeps) stand for them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import platform
import resource
import threading
from typing import TYPE_CHECKING

from autofit.devices._base import DeviceBackend, DeviceInfo, check_memory_limit
from autofit.errors import UsageError
from autofit.units import format_size

if TYPE_CHECKING:
    from autofit.export import MemoryBudget


def read_proc_status(pid: int | str = "self") -> dict[str, int]:
    """The kB fields of /proc/<pid>/status, in bytes."""
    values: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                values[key] = int(parts[0]) * 1024
    return values


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """The CPU's feature flags (x86 "flags", Arm "Features") from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_native_bf16() -> bool:
    """bf16 instructions (AVX512-BF16 or AMX on x86, BF16 on Arm): without them bf16 is emulated."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


def total_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cpu_info(index: int = 0) -> DeviceInfo:
    return DeviceInfo(
        type="cpu",
        index=index,
        name=f"{cpu_name()} ({os.cpu_count()} cores)",
        total_bytes=total_memory_bytes(),
        free_bytes=available_memory_bytes(),
    )


_SAMPLE_INTERVAL_S = 0.002
#: The name of the thread that samples VmData beside a probe's steps.
SAMPLER_THREAD = "autofit-memory-sampler"
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class CpuBackend(DeviceBackend):
    """The CPU under a real RLIMIT_DATA cap (see the module docstring for what counts)."""

    type = "cpu"

    def torch_device(self):
        import torch

        return torch.device("cpu")

    def info(self) -> DeviceInfo:
        return cpu_info(self.index)

    def supported_precisions(self) -> tuple[str, ...]:
        return ("fp32", "bf16", "fp16")  # TF32 is a tensor-core format: nothing to gain on CPU

    def default_precisions(self) -> tuple[str, ...]:
        # fp16 runs on CPU but is emulated on most: a matmul measured 70x slower than fp32 here,
        # so a search only tries it when asked (--precision ...,fp16). bf16 likewise, unless the
        # CPU has bf16 instructions: without them a bf16 MLP step measured 15x slower than fp32.
        return ("fp32", "bf16") if cpu_has_native_bf16() else ("fp32",)

    def apply_memory_limit(self, budget: MemoryBudget | None) -> None:
        # The cap is the limit itself: glibc keeps no cache that a probe's peak could hide in, so the
        # measured peak is the need, and the search judges it against the usable memory.
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        memory_limit = budget.limit_bytes if budget else None
        if memory_limit is None:
            resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))
            self.memory_limit = None
            return
        check_memory_limit(memory_limit, self.info(), given=None)
        used = self.used_bytes()
        if used >= memory_limit:
            raise UsageError(
                f"The memory limit must exceed what the worker needs just to start "
                f"({format_size(used)}: Python, torch and your script), but got {format_size(memory_limit)}."
            )
        if hard != resource.RLIM_INFINITY and memory_limit > hard:
            memory_limit = hard
        resource.setrlimit(resource.RLIMIT_DATA, (memory_limit, hard))
        self.memory_limit = memory_limit

    def used_bytes(self) -> int:
        return read_proc_status()["VmData"]

    def _sampled_data_bytes(self) -> int:
        """VmData, read cheaply: /proc/self/statm's data field (data + stack pages) less the stack.

        The sampler runs beside the user's training loop and takes the GIL each time: parsing
        /proc/self/status costs ~70 us, statm ~3 us. Even so its wake-ups cost a host-bound step 4%,
        so it sleeps while a probe's steps are timed (`timing`).
        """
        fields = os.pread(self._statm, 128, 0).split()
        return int(fields[5]) * _PAGE_SIZE - self._stack_bytes

    def reset_peak(self) -> None:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # resets VmHWM to the current resident set
        self._stop_sampler()
        if getattr(self, "_statm", None) is None:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        self._stack_bytes = read_proc_status().get("VmStk", 0)
        self._data_peak = self.used_bytes()
        self._peak_open = True
        self._start_sampler()

    def timing(self, timed: bool) -> None:
        """The sampler sleeps while a probe's measured steps are timed (VmData read where they begin and end)."""
        if not getattr(self, "_peak_open", False):
            return
        self._data_peak = max(self._data_peak, self._sampled_data_bytes())
        if timed:
            self._stop_sampler()
        elif getattr(self, "_sampler", None) is None:
            self._start_sampler()

    def _start_sampler(self) -> None:
        self._sampling = threading.Event()
        self._sampler = threading.Thread(target=self._sample_data, args=(self._sampling,), daemon=True,
                                         name=SAMPLER_THREAD)
        self._sampler.start()

    def _sample_data(self, stop: threading.Event) -> None:
        while not stop.wait(_SAMPLE_INTERVAL_S):
            try:
                self._data_peak = max(self._data_peak, self._sampled_data_bytes())
            except (OSError, KeyError, IndexError, ValueError):
                return

    def _stop_sampler(self) -> None:
        if getattr(self, "_sampler", None) is not None:
            self._sampling.set()
            self._sampler.join()
            self._sampler = None

    def peak_bytes(self) -> int:
        self._stop_sampler()
        self._peak_open = False
        status = read_proc_status()
        resident = max(0, status["VmHWM"] - status.get("RssFile", 0) - status.get("RssShmem", 0))
        return max(resident, getattr(self, "_data_peak", 0), status["VmData"])

    def synchronize(self) -> None:
        pass  # CPU ops are synchronous

    def release(self) -> None:
        gc.collect()
        _libc.malloc_trim(0)  # hand freed heap pages back, so the next probe starts at baseline
