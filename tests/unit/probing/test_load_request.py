"""The load request carries the memory budget as one object, and on the wire as the two numbers a child
process has always read (`memory_limit`, `usable_bytes`), so a worker of either form reads the other."""

from __future__ import annotations

from autofit.export import MemoryBudget
from autofit.probing import LoadRequest

MIB = 2**20


def test_the_budget_goes_on_the_wire_as_its_limit_and_whole_usable_bytes_and_comes_back():
    budget = MemoryBudget.of(800 * MIB, 0.1)  # usable 720 MiB less a fraction of a byte: a float
    wire = LoadRequest("train.py", device="cpu", budget=budget).to_wire()
    assert wire["memory_limit"] == 800 * MIB and wire["usable_bytes"] == int(budget.usable_bytes)
    assert "budget" not in wire
    back = LoadRequest.from_wire(wire).budget
    assert back.limit_bytes == 800 * MIB and back.usable_bytes == int(budget.usable_bytes)


def test_no_budget_is_the_whole_device_both_ways():
    wire = LoadRequest("train.py").to_wire()
    assert wire["memory_limit"] is None and wire["usable_bytes"] is None
    assert LoadRequest.from_wire(wire).budget is None


def test_a_request_in_the_older_form_reads():
    old = {"script": "train.py", "function": None, "device": "cpu", "index": 0, "memory_limit": 2**30,
           "usable_bytes": 900 * MIB, "probe_process": "persistent"}
    request = LoadRequest.from_wire(old)
    assert request.budget == MemoryBudget(limit_bytes=2**30, usable_bytes=900 * MIB)
    assert request.probe_process == "persistent" and request.to_wire() == old
