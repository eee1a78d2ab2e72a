"""The CUDA half of the activation offload (autofit.runtime._offload.CudaTransport) against fakes of CUDA's
streams: the order of its waits, copies and events. What a fake proves: the calls come in the order that keeps a
tensor from being read before it is written or reused while a copy reads it (the side stream waits for the
compute stream before each copy; the compute stream waits on the copy's event before use; a tensor brought back
is `record_stream`'d for the side stream); not that CUDA overlaps them (the GPU step's figures say that)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from autofit.runtime._offload import CudaTransport


class FakeStream:
    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(f"{self.name} waits for {other.name}")

    def record_event(self) -> str:
        self.log.append(f"{self.name} records")
        return f"{self.name}'s event"

    def wait_event(self, event: str) -> None:
        self.log.append(f"{self.name} waits on {event}")


class OnTheCpu(CudaTransport):
    """CUDA's transport with its allocations on the CPU (the copies are real; the streams the fakes')."""

    def _pinned(self, like: torch.Tensor) -> torch.Tensor:
        self.side.log.append("pins host memory")
        return torch.empty_like(like)

    def _on_device(self, like: torch.Tensor) -> torch.Tensor:
        self.side.log.append("allocates on the device")
        return torch.empty_like(like)


@pytest.fixture
def log(monkeypatch) -> list[str]:
    entries: list[str] = []
    compute = FakeStream("compute", entries)

    @contextmanager
    def on(stream: FakeStream):
        entries.append(f"on {stream.name}")
        yield
        entries.append(f"off {stream.name}")

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: FakeStream("side", entries))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: compute)
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: entries.append(
        f"kept from reuse until {stream.name}'s work is done"))
    return entries


def test_a_copy_to_the_host_waits_for_the_compute_stream_and_marks_its_end(log):
    transport = OnTheCpu(torch.device("cuda", 0))
    flat = torch.arange(6.0)
    host, event = transport.to_host(flat)
    assert torch.equal(host, flat) and event == "side's event"
    assert log == ["side waits for compute", "on side", "pins host memory", "side records", "off side"]


def test_a_copy_back_is_allocated_for_the_compute_stream_and_kept_until_the_side_stream_wrote_it(log):
    transport = OnTheCpu(torch.device("cuda", 0))
    flat, event = transport.to_device(torch.arange(6.0))
    transport.wait(event)
    assert torch.equal(flat, torch.arange(6.0))
    assert log == ["allocates on the device", "side waits for compute", "on side", "side records", "off side",
                   "kept from reuse until side's work is done", "compute waits on side's event"]


def test_pinned_memory_is_counted_as_the_host_allocator_rounds_it():
    rounded = CudaTransport.pinned_bytes
    assert [rounded(None, n) for n in (1, 3, 4096, 2**20 + 1)] == [1, 4, 4096, 2**21]
