"""Fixtures of the white-box tests: the CUDA backend against fakes of NVML and torch.cuda (fake_cuda.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import autofit.devices._cuda as cuda_mod
from tests.whitebox.fake_cuda import FakeCuda, FakeNVML, gpu


@pytest.fixture
def nvml(monkeypatch):
    fake = FakeNVML([gpu(), gpu(name="NVIDIA H100 80GB HBM3")])
    monkeypatch.setattr(cuda_mod, "_load_nvml", lambda: fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


@pytest.fixture
def fake_cuda(monkeypatch):
    state = FakeCuda()
    c = torch.cuda
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)

    def record(name, result=None):
        def fn(*args, **kwargs):
            state.calls.append(name)
            return result

        return fn

    def is_bf16_supported(including_emulation: bool = True):
        state.calls.append(f"is_bf16_supported(including_emulation={including_emulation})")
        return state.bf16

    monkeypatch.setattr(c, "is_available", lambda: True)
    monkeypatch.setattr(c, "set_device", record("set_device"))
    monkeypatch.setattr(c, "memory_reserved", lambda device=None: state.reserved)
    monkeypatch.setattr(c, "max_memory_reserved", lambda device=None: state.max_reserved)
    monkeypatch.setattr(c, "mem_get_info", lambda device=None: (state.free, state.total))
    monkeypatch.setattr(
        c, "set_per_process_memory_fraction", lambda fraction, device=None: state.fractions.append((fraction, device))
    )
    monkeypatch.setattr(c, "get_device_capability", lambda device=None: state.capability)
    monkeypatch.setattr(c, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(c, "reset_peak_memory_stats", record("reset_peak_memory_stats"))
    monkeypatch.setattr(c, "reset_accumulated_memory_stats", record("reset_accumulated_memory_stats"))
    monkeypatch.setattr(c, "synchronize", record("synchronize"))
    monkeypatch.setattr(c, "empty_cache", record("empty_cache"))
    monkeypatch.setattr(c, "memory_allocated", lambda device=None: state.allocated)
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", record("clear_cublas_workspaces"), raising=False)
    monkeypatch.setattr(c, "memory_stats", lambda device=None: state.stats)
    monkeypatch.setattr(c, "host_memory_stats", lambda: state.host_stats)
    monkeypatch.setattr(c, "reset_peak_host_memory_stats", record("reset_peak_host_memory_stats"))
    monkeypatch.setattr(torch.accelerator, "empty_host_cache", record("empty_host_cache"))
    monkeypatch.setattr(c, "get_allocator_backend", lambda: state.allocator_backend)
    monkeypatch.setattr(c, "get_device_properties", lambda device=None: SimpleNamespace(
        uuid=state.uuids.get(device), multi_processor_count=state.multiprocessors.get(device, 108)))
    return state
