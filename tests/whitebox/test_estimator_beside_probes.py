"""Where the memory estimator runs during a search: in slices between the probes on the CPU (beside a
probe it would take the probe's cores), beside the probes on an accelerator with cores to spare (in
slices there it answered nothing in a 2m30s GPT-2 search on an H100: benchmarks/gpu.md, 2026-11-25)."""

from __future__ import annotations

import threading

import pytest

from autofit.memory import StoredEstimates
from autofit.search import _estimator_slices as slices
from autofit.search._settings import SearchSettings


class _Process:
    """The estimator's process as the lifecycle drives it: stopped and continued."""

    def __init__(self) -> None:
        self.signals: list[str] = []

    def pause(self) -> None:
        self.signals.append("stop")

    def resume(self) -> None:
        self.signals.append("continue")

    def close(self) -> None:
        self.signals.append("close")


class _Estimation:
    """A space estimation that never answers (the lifecycle's waits end at their limits)."""

    def __init__(self, estimator, space, memory_limit, first=None, previous=None) -> None:
        self.finished, self.answered, self.curve = threading.Event(), threading.Event(), threading.Event()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def snapshot(self) -> StoredEstimates:
        return StoredEstimates.from_dict({})


class _Reporter:
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)


def _lifecycle(monkeypatch, cores: int) -> tuple[slices.EstimatorLifecycle, _Process, _Reporter]:
    monkeypatch.setattr(slices, "SpaceEstimation", _Estimation)
    monkeypatch.setattr(slices, "available_cores", lambda: cores)
    monkeypatch.setattr(slices, "_kept", lambda study: None)
    monkeypatch.setattr(slices, "_SLICE_S", 0.01)
    reporter = _Reporter()
    lifecycle = slices.EstimatorLifecycle(SearchSettings(script="train.py"), "train.py", reporter, [])
    process = _Process()
    lifecycle._estimator = process
    return lifecycle, process, reporter


@pytest.mark.parametrize("device_type, cores, beside", [("cpu", 2, False), ("cpu", 64, False),
                                                        ("cuda", 4, False), ("cuda", 16, True)])
def test_only_an_accelerator_with_cores_to_spare_runs_it_beside_the_probes(device_type, cores, beside):
    assert slices.runs_beside_probes(device_type, cores) is beside


def test_on_a_gpu_machine_it_is_continued_once_and_never_stopped_for_a_probe(monkeypatch):
    lifecycle, process, reporter = _lifecycle(monkeypatch, cores=16)
    lifecycle.ask(None, space=None, memory_limit=2**30, device_type="cuda", budget_s=1.0)
    for _ in range(3):  # three probes, each announced as the search does, then the next proposal
        lifecycle.pause()
        lifecycle.update(None)
    assert process.signals == ["continue"]
    assert "beside the probes" in reporter.notes[-1]


def test_on_the_cpu_it_is_stopped_for_every_probe(monkeypatch):
    lifecycle, process, reporter = _lifecycle(monkeypatch, cores=16)
    lifecycle.ask(None, space=None, memory_limit=2**30, device_type="cpu", budget_s=10.0)
    for _ in range(3):
        lifecycle.pause()
        lifecycle.update(None)
    assert process.signals.count("stop") >= 3 + 3  # each probe, and the end of each slice
    assert process.signals[-1] == "stop"  # never left running when the search hands out no time
    assert "between the probes" in reporter.notes[-1]
