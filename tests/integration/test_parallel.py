"""Parallel search, for real: several workers in one search (--workers on the CPU, as --gpu 0,1,... on
GPUs), and several searchers sharing one study through a real PostgreSQL server or a journal file,
with a searcher killed mid-probe whose trial another searcher probes again."""
import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from click.testing import CliRunner

from autofit.cli import cli
from autofit.findings import observations
from tests.support import REPO, autofit_cli, script


def _search(tmp_path, storage: str, *extra: str, target: str = "grows.py") -> list[str]:
    return [sys.executable, "-m", "autofit.cli", "search", script(target), "--device", "cpu", "--memory-limit",
            "768MiB", "--storage", storage, "--study", "shared", "--out", str(tmp_path / "best.json"), *extra]


def _trials(storage: str, name: str = "shared") -> list:
    from autofit.study import open_for_reading

    return optuna.load_study(study_name=name, storage=open_for_reading(storage)).get_trials(deepcopy=False)


def _explored_once(trials) -> None:
    explored = [o.config for o in observations(trials) if o.phase == "explore"]
    assert explored and len(explored) == len(set(explored))  # no config explored twice, by anyone
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]


@pytest.mark.slow
def test_two_cpu_workers_feed_one_study_and_export_one_answer(tmp_path):
    storage = f"sqlite:///{tmp_path}/w.db"
    searched = autofit_cli(*_search(tmp_path, storage, "--parallel", "2", "--trials", "8", "--budget", "10m")[3:],
                           cwd=tmp_path)
    assert searched.returncode == 0, searched.stderr[-3000:]
    assert "(worker 0)" in searched.stderr and "(worker 1)" in searched.stderr  # both probed
    trials = _trials(storage)
    _explored_once(trials)
    devices = {t.user_attrs["owner"]["device"] for t in trials if "owner" in t.user_attrs}
    assert devices == {"cpu:0"}  # each probe records the device it ran on
    workers = {t.user_attrs["owner"]["pid"] for t in trials if "owner" in t.user_attrs}
    assert len(workers) == 1  # one searcher (its workers are its threads' subprocesses)
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["device"]["type"] == "cpu" and best["config"]["batch_size"] >= 1


@pytest.mark.parametrize("args, message", [
    (["--device", "cuda", "--parallel", "2"], "--parallel is for the CPU"),
    (["--gpu", "0,1", "--device", "cpu"], "--gpu must go with --device cuda"),
    (["--gpu", "1,1"], "Each GPU must be listed once"),
])
def test_parallel_options_that_cannot_work_are_one_line_errors(tmp_path, args, message):
    result = CliRunner().invoke(cli, ["search", script("grows.py"), *args, "--storage", f"sqlite:///{tmp_path}/x.db"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("autofit: error:") and message in result.output
    assert result.output.count("\n") == 1


def test_gpus_of_different_models_are_refused(monkeypatch):
    from autofit.devices import DeviceInfo
    from autofit.errors import UsageError
    from autofit.search import _session

    cards = {0: DeviceInfo("cuda", 0, "NVIDIA H100 80GB HBM3", 80 * 2**30),
             1: DeviceInfo("cuda", 1, "NVIDIA A100-SXM4-40GB", 40 * 2**30)}
    monkeypatch.setattr(_session, "check_device", lambda device, index: cards[index])
    with pytest.raises(UsageError, match="identical"):
        _session.same_devices("cuda", (0, 1))
    assert _session.same_devices("cuda", (0, 0)).name == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres), pytest.param("journal", marks=pytest.mark.slow)])
def test_two_searchers_on_one_shared_storage_record_every_config_once(tmp_path, request, backend):
    storage = request.getfixturevalue("postgres_url") if backend == "postgres" else str(tmp_path / "shared.journal")
    command = _search(tmp_path, storage, "--trials", "4", "--budget", "10m", "-q", "--json")
    env = {**os.environ, "PYTHONPATH": REPO}
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    trials = _trials(storage)
    _explored_once(trials)
    owners = {t.user_attrs["owner"]["pid"] for t in trials if "probe" in t.user_attrs}
    assert owners == {p.pid for p in procs}  # each searcher's probes are kept
    # Any machine reads the same storage: the study is listed and shown from it.
    listed = autofit_cli("studies", "--storage", storage, cwd=tmp_path)
    assert listed.returncode == 0 and "shared" in listed.stdout, listed.stderr
    shown = autofit_cli("show", "--study", "shared", "--storage", storage, cwd=tmp_path)
    assert shown.returncode == 0 and "samples/s" in shown.stdout, shown.stderr


@pytest.mark.serial  # killed well inside a probe, a 100 s budget
@pytest.mark.postgres
def test_a_searcher_killed_mid_probe_has_its_trial_probed_by_another(tmp_path, postgres_url):
    """SIGKILL leaves the killed searcher's trial RUNNING; the searcher still alive waits for it (what it
    finds decides the search), fails it once its owner is dead, and probes that config itself. One
    config in the space (batch 16, 0.5 s a step), so the live searcher must have it."""
    command = _search(tmp_path, postgres_url, "--budget", "100s", "--batch-size", "16:16", "-q",
                      target="slow_above.py")
    env = {**os.environ, "PYTHONPATH": REPO}
    first = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, killed = time.monotonic() + 90, None
    while time.monotonic() < deadline and killed is None:
        time.sleep(0.3)
        try:
            slow = [t for t in _trials(postgres_url) if t.state == optuna.trial.TrialState.RUNNING
                    and t.params.get("batch_size", 0) >= 8 and t.user_attrs.get("owner", {}).get("pid") == first.pid]
        except Exception:  # noqa: BLE001 - the study may not exist yet
            continue
        if slow:
            second = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
            time.sleep(1.0)
            os.kill(first.pid, signal.SIGKILL)
            killed = slow[0]
    first.wait(timeout=10)
    assert killed is not None, "the first searcher never reached a slow probe"
    out, err = second.communicate(timeout=240)
    assert second.returncode == 0, err[-3000:]
    trials = _trials(postgres_url)
    assert trials[killed.number].state == optuna.trial.TrialState.FAIL
    again = [t for t in trials if t.number > killed.number and t.params == killed.params
             and t.user_attrs.get("owner", {}).get("pid") == second.pid and t.user_attrs.get("status") == "ok"]
    assert again, "the live searcher must probe the killed searcher's config"
    _explored_once(trials)


