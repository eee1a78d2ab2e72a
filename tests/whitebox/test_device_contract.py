"""The contract every device backend keeps (autofit.devices.DeviceBackend), one suite run over each
of them: the CPU backend for real (in this process, its RLIMIT_DATA restored afterwards) and the CUDA
backend against the fakes of torch.cuda and NVML in tests/whitebox/fake_cuda.py, given the caching
allocator's behaviour where the contract needs it (a cache that `release` empties, a peak that
`reset_peak` restarts). A backend added to BACKENDS gets every test.

What a backend promises: it describes its device; it applies a memory limit, caps what a config may
use between the usable bytes and the limit, lifts it again, and refuses a limit below what the
process already holds (its baseline) or above the device's memory; its peak counts what was allocated since `reset_peak`;
`release` gives freed memory back so the next probe starts at the baseline; `synchronize` waits for
queued work; its allocator counters are plain data a study can store."""
from __future__ import annotations

import json
import os
import resource
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

import autofit.devices._cuda as cuda_mod
from autofit.devices import DeviceBackend, DeviceInfo
from autofit.devices._cpu import CpuBackend
from autofit.devices._cuda import CudaBackend
from autofit.errors import UsageError
from autofit.export import MemoryBudget
from tests.whitebox.fake_cuda import FakeCuda, FakeNVML, gpu

MiB = 2**20
GiB = 2**30
CHUNK = 64 * MiB


class CpuDevice:
    """The CPU backend for real: tensors allocated in this process, the cap read back from the kernel."""

    def __init__(self) -> None:
        self.backend = CpuBackend(0)
        self._kept: list[torch.Tensor] = []

    def allocate(self, nbytes: int) -> None:
        self._kept.append(torch.ones(nbytes // 4))  # touched: resident and in the data segment

    def free(self) -> None:
        self._kept.clear()

    def cap(self) -> int | None:
        """What the device refuses beyond (None: no cap below the system's own)."""
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        return None if soft == hard else soft

    def waited(self) -> bool:
        return True  # CPU work is done when the call returns


class FakeCudaDevice:
    """The CUDA backend against fakes: a caching allocator whose cache `release` empties and whose
    peak `reset_peak` restarts, and 300 MiB outside it (the context) that NVML reports."""

    OVERHEAD = 300 * MiB

    def __init__(self, nvml: FakeNVML, state: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
        self.state = state
        self.allocated = 0
        state.total, state.free = 16 * GiB, 16 * GiB
        monkeypatch.setattr(nvml, "nvmlDeviceGetComputeRunningProcesses", lambda handle: [
            SimpleNamespace(pid=os.getpid(), usedGpuMemory=self.OVERHEAD + state.reserved)])

        def empty_cache() -> None:
            state.calls.append("empty_cache")
            state.reserved = self.allocated

        def reset_peak_memory_stats(device=None) -> None:
            state.calls.append("reset_peak_memory_stats")
            state.max_reserved = state.reserved

        monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset_peak_memory_stats)
        self.backend = CudaBackend(0)

    def allocate(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.state.reserved = max(self.state.reserved, self.allocated)
        self.state.max_reserved = max(self.state.max_reserved, self.state.reserved)

    def free(self) -> None:
        self.allocated = 0  # the blocks stay cached (reserved) until release

    def cap(self) -> int | None:
        if not self.state.fractions or self.state.fractions[-1][0] >= 1.0:
            return None
        return round(self.state.fractions[-1][0] * self.state.total) + self.OVERHEAD

    def waited(self) -> bool:
        return self.state.calls[-1:] == ["synchronize"]


BACKENDS = ["cpu", "cuda-fake"]


@pytest.fixture(params=BACKENDS)
def device(request, monkeypatch) -> Iterator[CpuDevice | FakeCudaDevice]:
    if request.param == "cpu":
        limits = resource.getrlimit(resource.RLIMIT_DATA)
        made = CpuDevice()
        try:
            yield made
        finally:
            made.free()
            resource.setrlimit(resource.RLIMIT_DATA, limits)
    else:
        fake_nvml = FakeNVML([gpu(total=16 * GiB, free=16 * GiB)])
        monkeypatch.setattr(cuda_mod, "_load_nvml", lambda: fake_nvml)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        yield FakeCudaDevice(fake_nvml, request.getfixturevalue("fake_cuda"), monkeypatch)


def test_a_backend_describes_its_device(device):
    backend: DeviceBackend = device.backend
    info = backend.info()
    assert isinstance(info, DeviceInfo) and info.type == backend.type and info.index == backend.index
    assert info.total_bytes > 0
    assert backend.torch_device().type == backend.type
    assert "fp32" in backend.supported_precisions()
    assert set(backend.default_precisions()) <= set(backend.supported_precisions())
    assert backend.memory_limit is None  # no limit until one is applied


def test_a_limit_caps_between_the_usable_memory_and_the_limit_and_is_lifted(device):
    backend = device.backend
    backend.release()
    used = backend.used_bytes()
    limit, usable = used + 512 * MiB, used + 384 * MiB
    backend.apply_memory_limit(MemoryBudget(limit_bytes=limit, usable_bytes=usable))
    assert backend.memory_limit == limit
    cap = device.cap()
    assert cap is not None and usable <= cap <= limit
    assert backend.used_bytes() < cap
    backend.apply_memory_limit(None)
    assert backend.memory_limit is None and device.cap() is None


def test_a_limit_below_the_baseline_is_refused_and_changes_nothing(device):
    backend = device.backend
    backend.release()
    baseline, cap = backend.used_bytes(), device.cap()
    assert baseline > 0  # the process's own memory counts, as the limit counts it
    with pytest.raises(UsageError, match="must exceed what the worker needs just to start"):
        backend.apply_memory_limit(MemoryBudget(limit_bytes=baseline // 2))
    assert backend.memory_limit is None and device.cap() == cap


def test_a_limit_above_the_devices_memory_is_refused_and_changes_nothing(device):
    backend = device.backend
    total, cap = backend.info().total_bytes, device.cap()
    with pytest.raises(UsageError, match=r"must be at most \w+:0's memory"):
        backend.apply_memory_limit(MemoryBudget(limit_bytes=total + GiB))
    assert backend.memory_limit is None and device.cap() == cap


def test_the_peak_counts_what_was_allocated_since_reset_and_release_returns_to_the_baseline(device):
    backend = device.backend
    backend.release()
    backend.reset_peak()
    before = backend.used_bytes()
    device.allocate(CHUNK)
    peak = backend.peak_bytes()
    assert peak >= before + CHUNK * 0.9
    device.free()
    backend.release()
    assert backend.used_bytes() < before + CHUNK * 0.25  # freed memory went back
    backend.reset_peak()
    assert backend.peak_bytes() < peak - CHUNK * 0.5  # a new measurement starts from now


def test_synchronize_waits_for_queued_work(device):
    assert device.backend.synchronize() is None
    assert device.waited()


def test_allocator_counters_are_plain_data_a_study_stores(device):
    backend = device.backend
    backend.reset_peak()
    stats = backend.allocator_stats()
    assert isinstance(stats, dict)
    assert json.loads(json.dumps(stats)) == stats
    assert int(stats.get("num_alloc_retries", 0) or 0) >= 0
