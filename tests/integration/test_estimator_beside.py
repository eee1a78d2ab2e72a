"""The memory estimator in a search: a process at idle priority, stopped while a probe runs, given
slices of time between probes that never exceed a few percent of the budget; and the CPU's runtime
context measured, not assumed."""
from __future__ import annotations

import json
import os
import resource

import optuna
import pytest

from autofit.config import Config
from autofit.memory import (
    CPU_TYPICAL_FACTOR,
    Estimator,
    StoredEstimates,
    estimate_memory,
    peak_factors,
    stored_estimates,
)
from autofit.planner import MemoryPrediction
from autofit.study import trial_config
from tests.support import CORPUS, STUDIES, autofit_cli, script

pytestmark = pytest.mark.serial  # tight budgets or speeds measured (pyproject.toml)


def _estimator_pids() -> list[int]:
    pids = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as handle:
            pids += [int(p) for p in handle.read().split()]
    out = []
    for pid in pids:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            if b"_estimate_process" in handle.read():
                out.append(pid)
    return out


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's idle scheduling class")
def test_the_estimator_takes_only_idle_cpu_time():
    with Estimator(f"{STUDIES}/mlp.py") as estimator:
        assert estimator.wait_ready()
        (pid,) = _estimator_pids()
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE


@pytest.mark.slow  # an estimator process loading torch
@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's idle scheduling class")
def test_the_estimator_answers_at_normal_priority_where_it_runs_only_in_the_slices_it_is_given():
    """At idle priority a slice between probes went to whatever else was runnable: a 2-minute search of
    nanoGPT's loop answered 1 of 6 configs in its 7 s of slices, each estimate 0.3-0.5 s alone."""
    if os.geteuid() != 0 and resource.getrlimit(resource.RLIMIT_NICE)[0] < 20:
        pytest.skip("Linux lets an unprivileged process leave SCHED_IDLE only under RLIMIT_NICE 20 or more")
    with Estimator(f"{STUDIES}/mlp.py", beside_probes=False) as estimator:
        assert estimator.wait_ready()
        (pid,) = _estimator_pids()
        assert os.sched_getscheduler(pid) == os.SCHED_OTHER


@pytest.mark.slow  # a 2-minute search (it ends in about 30 s: the planner runs out of configs worth probing)
def test_a_short_search_of_a_held_out_script_has_the_first_probes_strategy_estimated(tmp_path):
    """nanoGPT's loop (tests/corpus), searched for 2 minutes on the CPU: the estimator's first answers are
    the line of the strategy the search probed first (its two smallest micro-batches), not the smallest
    micro-batch of each precision (1 of 6 configs, the first of another precision next, at idle priority)."""
    done = autofit_cli("search", os.path.join(CORPUS, "nanogpt_train.py"), "--budget", "2m",
                       "--storage", f"sqlite:///{tmp_path}/s.db", "--study", "s", cwd=tmp_path, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no estimate" not in done.stderr
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db")
    first = trial_config(min(study.trials, key=lambda t: t.number))
    estimated = stored_estimates(study).breakdowns
    assert len([c for c in estimated if c.precision == first.precision and not c.checkpoint_segments]) >= 2, estimated


def test_the_cpu_runtime_context_is_measured_and_predicted_beside_the_tensors():
    found = estimate_memory(f"{STUDIES}/mlp.py", [Config(batch_size=256), Config(batch_size=1024)])
    assert found.error is None
    # Thread stacks, malloc arenas, oneDNN's and the BLAS library's buffers: tens of MiB on any CPU,
    # and none of it a tensor the fake tensors could count.
    assert 4 * 2**20 < found.context_bytes < 1024 * 2**20
    stored = StoredEstimates({c: dict(e.breakdown) for c, e in found.estimates.items()}, found.baseline_bytes, 1.0,
                             None, 2, context_bytes=found.context_bytes)
    assert stored.device_bytes == found.baseline_bytes + found.context_bytes
    kept = StoredEstimates.from_dict(json.loads(json.dumps(stored.to_dict())))
    assert kept.context_bytes == found.context_bytes
    prediction = kept.prediction("cpu")
    tensors = found.estimates[Config(batch_size=256)].total_bytes
    assert prediction.raw_peak(Config(batch_size=256)) == pytest.approx(stored.device_bytes + CPU_TYPICAL_FACTOR * tensors)


def test_a_raw_peak_needs_an_estimate_of_the_strategy():
    prediction = MemoryPrediction.from_estimates({Config(batch_size=8): 8.0, Config(batch_size=16): 16.0}, device_bytes=100,
                                                **peak_factors("cpu"))
    assert prediction.raw_peak(Config(batch_size=12)) == pytest.approx(100 + CPU_TYPICAL_FACTOR * 12)
    assert prediction.raw_peak(Config(batch_size=8, precision="bf16")) is None


@pytest.mark.slow
def test_a_search_never_waits_for_an_estimator_that_takes_longer_than_its_budget(tmp_path):
    """The estimator's step sleeps an hour; the search probes, ends and exports without it (its slices
    of time add up to 6% of the budget at most), and keeps a record that says the search ended first
    (so that a resumed search asks again)."""
    out = tmp_path / "best.json"
    done = autofit_cli("search", script("slow_to_estimate.py"), "--trials", "3", "--budget", "10m",
                       "--memory-limit", "2GiB", "--storage", f"sqlite:///{tmp_path}/s.db", "--out", str(out),
                       "--study", "s", cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "memory estimator: estimating between the probes" in done.stderr
    assert "(the search ended first)" in done.stderr
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db")
    assert study.user_attrs["autofit_estimates"]["error"] == "the search ended first"
    assert len([t for t in study.trials if "probe" in t.user_attrs]) >= 3
    assert json.loads(out.read_text())["measured"]["samples_per_s"] > 0
    assert not _estimators_in(tmp_path)  # stopped at the search's end, not left sleeping


def _estimators_in(folder) -> list[int]:
    """Estimator processes anywhere whose working directory is `folder` (a search's children inherit it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if b"_estimate_process" in handle.read() and os.readlink(f"/proc/{pid}/cwd") == str(folder):
                    found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_no_probe_runs_beside_the_estimator(tmp_path):
    """Each probe writes down the state of the search's estimator process as the probe runs: stopped
    ("T") every time. Beside a probe, even at idle priority, it slowed a probe 3-9x on two cores."""
    states = tmp_path / "states"
    done = autofit_cli("search", script("sees_the_estimator.py"), "--trials", "4", "--budget", "5m",
                       "--memory-limit", "2GiB", "--storage", f"sqlite:///{tmp_path}/s.db", "--out",
                       str(tmp_path / "best.json"), cwd=tmp_path, env={"ESTIMATOR_STATES": str(states)})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = [line.split(",") for line in states.read_text().splitlines()]
    assert len(seen) >= 4
    running = [line for line in seen if line != [""]]  # once done, the estimator has exited
    assert running and all(state == "T" for line in running for state in line), seen
