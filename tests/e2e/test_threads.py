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
from autofit.probing import ProbeResult
from tests.support import autofit_cli, script
from tests.support.studies import records_config_with_best, study_of

GiB = 2**30


def _study(results: list[ProbeResult]) -> optuna.Study:
    return study_of(results, SearchSpace.build(batch_range=(1, 64), precisions=("fp32",)), (1, 64))


def _ok(batch: int, rate: float, threads: int | None) -> ProbeResult:
    return ProbeResult(status="ok", config=Config(batch_size=batch), samples_per_s=rate, peak_bytes=GiB,
                       step_time_median_s=1.0, step_time_iqr_s=0.02, threads=threads)


def test_the_best_config_carries_the_threads_its_winners_probes_ran_on():
    document = best_document(_study([_ok(8, 100.0, 1), _ok(16, 200.0, 2), _ok(16, 190.0, 2)]), "sqlite:///x.db",
                             stopped="done", partial=False)
    assert document["config"]["batch_size"] == 16 and document["measured"]["threads"] == 2
    recorded_before = best_document(_study([_ok(8, 100.0, None), _ok(16, 200.0, None)]), "sqlite:///x.db",
                                    stopped="done", partial=False)
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
    assert "the search's probes ran on 2 intra-op threads and this run has 1" in other.stderr
    assert "OMP_NUM_THREADS=2" in other.stderr
    assert json.loads((tmp_path / "r.json").read_text())["batch_size"] == 5  # warned, and trained as the file says
    same = run("2")
    assert same.returncode == 0 and "intra-op threads" not in same.stderr, same.stderr
