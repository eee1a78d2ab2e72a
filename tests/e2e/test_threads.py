"""On the CPU the intra-op thread count changes a config's peak (each thread keeps its own buffers: the eight
transformer blocks at batch 128 peak at 537 MiB on one thread, 579 MiB on two) as well as its speed. A probe
records the threads its steps ran on, the best-config file carries its winner's, and a CPU run on other
threads is warned, as a run under other allocator settings is."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import optuna
import pytest

from autofit import Config
from autofit.findings import best_document
from autofit.planner import SearchSpace
from autofit.probing import ProbeResult, Worker
from tests.support import autofit_cli, script
from tests.support.studies import records_config_with_best, study_of

GiB = 2**30


def _study(results: list[ProbeResult]) -> optuna.Study:
    return study_of(results, SearchSpace.build(batch_range=(1, 64), precision=("fp32",)), (1, 64))


def _ok(batch: int, rate: float, threads: int | None) -> ProbeResult:
    return ProbeResult(status="ok", config=Config(batch_size=batch), samples_per_s=rate, peak_bytes=GiB,
                       step_time_median_s=1.0, step_time_iqr_s=0.02, threads=threads)


def test_the_best_config_carries_the_threads_its_winners_probes_ran_on():
    document = best_document(_study([_ok(8, 100.0, 1), _ok(16, 200.0, 2), _ok(16, 190.0, 2)]), "sqlite:///x.db",
                             stopped="done", partial=False).to_dict()
    assert document["config"]["batch_size"] == 16 and document["measured"]["threads"] == 2
    recorded_before = best_document(_study([_ok(8, 100.0, None), _ok(16, 200.0, None)]), "sqlite:///x.db",
                                    stopped="done", partial=False).to_dict()
    assert "threads" not in recorded_before["measured"]  # nothing to compare a run with


@pytest.mark.slow  # a real probe through the command line: 11 s that the default tier's 5 minutes lack
def test_a_probe_records_the_threads_it_ran_on(tmp_path):
    probed = autofit_cli("probe", script("fits_small.py"), "--device", "cpu", "--memory-limit", "768MiB",
                         "--batch-size", "4", "--json", cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert probed.returncode == 0, probed.stderr[-3000:]
    assert json.loads(probed.stdout)["result"]["threads"] == 1


@pytest.mark.slow  # two real normal runs (13 s), as the allocator's warning test is
def test_a_cpu_run_on_other_threads_than_the_search_is_warned(tmp_path):
    records_config_with_best(tmp_path, measured={"threads": 2}, script={"path": str(tmp_path / "train.py")})
    env = {**os.environ, "RECORD_TO": str(tmp_path / "r.json"), "AUTOFIT_CONFIG": str(tmp_path / "best.json")}

    def run(threads: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env={**env, "OMP_NUM_THREADS": threads})

    other = run("1")
    assert other.returncode == 0, other.stderr
    assert "the search's probes ran on 2 intra-op threads and this run on 1" in other.stderr
    assert "OMP_NUM_THREADS=2" in other.stderr
    assert json.loads((tmp_path / "r.json").read_text())["batch_size"] == 5  # warned, and trained as the file says
    same = run("2")
    assert same.returncode == 0 and "intra-op threads" not in same.stderr, same.stderr


@pytest.mark.slow  # a real worker in each process model (about 8 s each)
@pytest.mark.parametrize("probe_process", ["fork", "persistent"])
def test_a_probe_runs_on_the_threads_the_script_sets_at_import(monkeypatch, probe_process):
    """The forking process runs on one thread while it imports the script, so a script's own
    torch.set_num_threads(1) there was invisible: its forked probes ran on OMP_NUM_THREADS's 2, recorded 2, and
    its run (on 1) was told to run with OMP_NUM_THREADS=2, which the script's call overrides."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("SCRIPT_THREADS", "1")
    with Worker(script("sets_its_threads.py"), probe_process=probe_process) as worker:
        worker.start()
        result = worker.probe(Config(batch_size=4), timeout=120)
    assert result.ok, result.error_message
    assert result.threads == 1


@pytest.mark.slow  # two real normal runs of a script (about 10 s)
def test_a_start_script_that_sets_its_threads_after_start_is_compared_on_them(tmp_path):
    """The run's threads were once compared when autofit.start ran, before the script set its own: a spurious
    warning, attributed to a line inside autofit. They are compared at the run's end, in one line."""
    document = {"schema": "autofit.best-config", "schema_version": 1,
                "config": {"batch_size": 4, "accumulation_steps": 1, "precision": "fp32", "checkpoint_segments": 0},
                "memory": {}, "device": {"type": "cpu", "name": "x"}, "versions": {},
                "script": {"path": script("starts_then_sets_threads.py")}}

    def run(searched: int) -> subprocess.CompletedProcess:
        best = tmp_path / f"best{searched}.json"
        best.write_text(json.dumps({**document, "measured": {"threads": searched}}))
        return subprocess.run([sys.executable, script("starts_then_sets_threads.py")], cwd=tmp_path, text=True,
                              capture_output=True, timeout=120, env={**os.environ, "AUTOFIT_CONFIG": str(best),
                                                                     "AUTOFIT_DEVICE": "cpu", "OMP_NUM_THREADS": "2"})

    same = run(1)
    assert same.returncode == 0, same.stderr
    assert "intra-op threads" not in same.stderr and "Warning" not in same.stderr, same.stderr
    other = run(2)
    assert other.returncode == 0, other.stderr
    assert "autofit: the search's probes ran on 2 intra-op threads and this run on 1" in other.stderr
    assert "Warning" not in other.stderr  # a line of its own, no warning attributed to a line of autofit's
