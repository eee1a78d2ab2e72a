"""The contract every device backend keeps: memory limit, peak, baseline, sync, clean-up."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from autofit.errors import UsageError
from autofit.units import format_size

if TYPE_CHECKING:
    import torch

    from autofit.export import MemoryBudget


@dataclass(frozen=True)
class DeviceInfo:
    """A device as the user sees it in `autofit devices` and in the best-config JSON."""

    type: str  # "cpu" or "cuda"
    index: int
    name: str
    total_bytes: int
    free_bytes: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def default_memory_limit(info: DeviceInfo, workers: int = 1) -> int:
    """The memory a search's probes may use when no limit is given: a GPU's whole memory; on the CPU what is
    free now, shared among the `workers` probing at once, so that the machine survives."""
    if info.type == "cpu":
        return int((info.free_bytes or info.total_bytes) / workers)
    return int(info.total_bytes)


def check_memory_limit(memory_limit: int | None, info: DeviceInfo, given: str | None = "--memory-limit") -> None:
    """A UsageError where a memory limit exceeds the device's memory: the probes would be judged against
    memory the device does not have (a GPU's allocator cannot be capped above the card). `given`: how the
    user gave it, where known."""
    if memory_limit is not None and memory_limit > info.total_bytes:
        named = f" ({given})" if given else ""
        raise UsageError(f"The memory limit{named} must be at most {info.type}:{info.index}'s memory "
                         f"({format_size(info.total_bytes)}, {info.name}), but got {format_size(memory_limit)}: "
                         f"give a smaller one, or none for the default.")


class DeviceBackend(ABC):
    """One device inside the worker process. Everything here runs where the probes run.

    Subclasses say precisely what `limit` caps and what `peak_bytes` counts, in their docstring.
    """

    type: str = ""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.memory_limit: int | None = None

    @abstractmethod
    def torch_device(self) -> torch.device:
        """The torch.device probes put tensors on."""

    @abstractmethod
    def info(self) -> DeviceInfo:
        """Name and memory of the device."""

    @abstractmethod
    def supported_precisions(self) -> tuple[str, ...]:
        """Precisions this device runs natively."""

    def default_precisions(self) -> tuple[str, ...]:
        """Precisions a search tries when the user names none: the supported ones that can be fast, the
        one an engineer would set by hand first (the search's pilot runs it)."""
        return self.supported_precisions()

    @abstractmethod
    def apply_memory_limit(self, budget: MemoryBudget | None) -> None:
        """Enforce the budget's limit on this process from now on (None, or a limit of None: the whole device).

        Its `usable_bytes` is what a config may use (the limit less the search's headroom); a backend
        whose allocator caches memory caps it there, so the cache cannot hide a config that needs
        more. Raises UsageError when the process already uses more than the limit.
        """

    @abstractmethod
    def used_bytes(self) -> int:
        """Memory this process holds now, counted the way the limit counts it."""

    def tensor_bytes(self) -> int | None:
        """Of `used_bytes`, what live tensors hold (a probe that left tensors behind shows here), or None
        where the reading cannot tell them from the rest (a CPU's heap)."""
        return None

    @abstractmethod
    def reset_peak(self) -> None:
        """Start a new peak measurement."""

    @abstractmethod
    def peak_bytes(self) -> int:
        """Peak since `reset_peak`, comparable with the limit."""

    def timing(self, timed: bool) -> None:
        """A probe's measured steps begin (True) or end (False): what the backend runs beside the user's steps to
        read its peak pauses while they are timed (the CPU's sampler), so the probe times the steps its normal run
        runs. Nothing by default."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for queued work, so that a timestamp means the work is done."""

    @abstractmethod
    def release(self) -> None:
        """Return freed memory to the device/OS (gc, caches) so the next probe starts clean."""

    def allocator_stats(self) -> dict:
        """Extra allocator counters worth keeping with a probe (e.g. CUDA alloc retries)."""
        return {}

    def allocations(self) -> int | None:
        """Tensors allocated on the device since `reset_peak`, where its allocator counts them (None: not
        counted, as on the CPU, where every tensor a script makes is on the device anyway)."""
        return None

    def alloc_retries(self) -> int | None:
        """The allocator's count of the times it freed its cache to retry an allocation (CUDA's
        num_alloc_retries, since `reset_peak`), or None where it keeps none (a CPU): probes read it where
        measuring starts and ends, the normal run where its measuring starts and where it ends."""
        return None

    def energy_joules(self) -> float | None:
        """The device's cumulative energy counter in joules, or None where it has none (a CPU):
        probes read it where measuring starts and ends for joules per sample."""
        return None

    def peak_flops_per_s(self, precision: str) -> float | None:
        """The device's dense peak FLOP/s at `precision` (MFU's denominator), None where unknown."""
        return None
