"""Both process models give a probe the same start: `--probe-process fork` (each probe in a child of
the warm process, the CPU's default) and `persistent` (one after another in one process, as on CUDA).

tests/scripts/leaves_state.py leaves process state behind (every kind it knows, with LEAVES=all) and
fails naming what it finds an earlier probe left; in one process, the second probe must find nothing
(the probing subpackage puts the process back between probes)."""

from __future__ import annotations

import os

import pytest

from autofit.config import Config
from autofit.errors import UsageError
from autofit.export import MemoryBudget
from autofit.probing import Worker, probe_process_for
from tests.support import script

LIMIT = 1024 * 2**20


def _two_probes(monkeypatch, tmp_path, leaves: str, probe_process: str):
    monkeypatch.setenv("LEAVES", leaves)
    monkeypatch.setenv("FIRST_DRAW", str(tmp_path / "first-draw"))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the script's check of its threads needs more than one
    monkeypatch.setenv("EXPECT_THREADS", "2")
    with Worker(script("leaves_state.py"), budget=MemoryBudget(limit_bytes=LIMIT), probe_process=probe_process) as worker:
        return [worker.probe(Config(batch_size=batch), warmup=1, steps=2, timeout=120) for batch in (8, 16)]


@pytest.mark.parametrize("probe_process", ["persistent", pytest.param("fork", marks=pytest.mark.slow)])
def test_a_probe_finds_nothing_the_one_before_it_left(monkeypatch, tmp_path, probe_process):
    first, second = _two_probes(monkeypatch, tmp_path, "all", probe_process)
    assert first.status == "ok", first.error_message
    assert second.status == "ok", second.error_message


@pytest.mark.slow
def test_a_model_built_at_import_is_reported_in_one_process_only(monkeypatch, tmp_path):
    persistent = _two_probes(monkeypatch, tmp_path, "module_model", "persistent")
    assert all(p.status == "ok" for p in persistent)
    assert not any("model_at_import" in n for n in persistent[0].notes)  # the first starts as loaded
    assert any("`model_at_import` at import" in n and "carry over" in n for n in persistent[1].notes)
    os.remove(tmp_path / "first-draw")
    forked = _two_probes(monkeypatch, tmp_path, "module_model", "fork")
    assert not any("model_at_import" in n for p in forked for n in p.notes)


def test_cuda_runs_its_probes_in_one_process():
    assert probe_process_for("cuda", None) == "persistent"
    assert probe_process_for("cpu", None) == "fork"
    assert probe_process_for("cpu", "persistent") == "persistent"
    with pytest.raises(UsageError, match="cannot be forked"):
        probe_process_for("cuda", "fork")
    with pytest.raises(UsageError, match="must be one of fork, persistent"):
        probe_process_for("cpu", "threads")


@pytest.mark.slow
def test_in_one_process_a_probe_starts_where_the_first_did_whatever_the_last_left():
    """keeps_on_an_object.py hangs 128 MiB a call on a model built at import: in one process each probe
    would carry the earlier ones' (the held-out Accelerate script read 466 MiB on its first probe and 1,023
    MiB ten later, under a 1 GiB limit). The worker is replaced when its memory does not come back."""
    with Worker(script("keeps_on_an_object.py"), budget=MemoryBudget(limit_bytes=LIMIT), probe_process="persistent") as worker:
        probes = [worker.probe(Config(batch_size=8), warmup=1, steps=2, timeout=120) for _ in range(4)]
    assert all(p.status == "ok" for p in probes), [p.error_message for p in probes]
    peaks = [p.peak_bytes for p in probes]
    assert max(peaks) - min(peaks) < 64 * 2**20, [p // 2**20 for p in peaks]
    assert any("the worker was replaced" in note for p in probes for note in p.notes)


@pytest.mark.slow  # a real probe or estimate of 7-9 s: the default tier stays under 5 minutes
def test_a_scripts_top_runs_once_a_probe_in_one_process():
    """hooks_before_start.py registers a global hook before its start call and fails on finding two: the
    worker's load (up to the start call) must leave nothing of its top to the probes."""
    with Worker(script("hooks_before_start.py"), budget=MemoryBudget(limit_bytes=LIMIT), probe_process="persistent") as worker:
        probes = [worker.probe(Config(batch_size=b), warmup=1, steps=2, timeout=120) for b in (4, 8)]
    assert [p.status for p in probes] == ["ok", "ok"], [p.error_message for p in probes]
