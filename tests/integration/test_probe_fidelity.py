"""A probe measures the steps its normal run runs (issue 52, items 4 and 11): nothing autofit runs beside a
probe's measured steps that the normal run does not run."""

from __future__ import annotations

import json

import pytest

from autofit.config import Config
from autofit.export import MemoryBudget
from autofit.probing import Worker
from tests.support import script


@pytest.mark.parametrize("probe_process", ["fork", "persistent"])
def test_the_memory_sampler_sleeps_while_a_probes_steps_are_timed(monkeypatch, tmp_path, probe_process):
    """The CPU's VmData sampler woke every 2 ms and took the GIL from the user's step: a host-bound probe read
    4% under its normal run, which runs no sampler. It samples the warm-up and the step after the measured ones
    (the same step again), and sleeps between."""
    out = tmp_path / "beside.json"
    monkeypatch.setenv("BESIDE_OUT", str(out))
    with Worker(script("threads_beside_steps.py"), budget=MemoryBudget(limit_bytes=1024 * 2**20),
                probe_process=probe_process) as worker:
        result = worker.probe(Config(batch_size=4), warmup=2, steps=5, min_measure_s=0.0, timeout=120)
    assert result.ok, result.error_message
    seen = json.loads(out.read_text())
    measured = [alive for _, measuring, alive in seen if measuring]
    warmup = [alive for steps, measuring, alive in seen if not measuring and steps < 2]
    after = [alive for steps, measuring, alive in seen if not measuring and steps >= 2]
    assert len(measured) == 5 and warmup and after
    assert not any(measured), seen  # asleep while timed
    assert all(warmup) and all(after), seen  # awake where the peak is read
    assert result.peak_bytes and result.peak_bytes >= result.baseline_bytes
