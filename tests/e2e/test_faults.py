"""The fault matrix: each fault a training script can throw, in a real search on CPU."""
from __future__ import annotations

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
from autofit.errors import NoFeasibleConfig, UsageError, UserCodeError
from autofit.findings import observations
from autofit.search import SearchSettings, run_search
from tests.support import REPO, script

LIMIT = 768 * 2**20


def settings(tmp_path, name: str, **kwargs) -> SearchSettings:
    base = dict(script=script(name), memory_limit=LIMIT, budget_s=90, storage=f"sqlite:///{tmp_path}/s.db",
                out=str(tmp_path / "best.json"))  # the A/B: one round (AUTOFIT_CONFIRM_FACTOR=1, tests/conftest.py)
    base.update(kwargs)
    return SearchSettings(**base)


def trials(tmp_path, result):
    return _study_trials(tmp_path, result.study_name)


def _study_trials(tmp_path, name: str):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/s.db").trials


def test_oom_at_every_batch_ends_quickly_with_nothing_fits_and_no_json(tmp_path):
    with pytest.raises(NoFeasibleConfig, match=r"Nothing fits under .*smallest config tried .* ran out of memory"):
        run_search(settings(tmp_path, "oom_always.py", budget_s=300, study="oom"))
    probed = [o.config.batch_size for o in observations(_study_trials(tmp_path, "oom"))]
    assert probed and probed[-1] == 1 and len(probed) <= 3  # down to batch 1, not through the budget
    assert not (tmp_path / "best.json").exists()


@pytest.mark.slow  # the default tier stays under 5 minutes on 2 cores
def test_oom_at_every_batch_exits_1_from_the_cli(tmp_path):
    result = CliRunner().invoke(cli, ["search", script("oom_always.py"), "--memory-limit", "768MiB", "--budget", "2m",
                                      "--storage", f"sqlite:///{tmp_path}/c.db", "--out", str(tmp_path / "b.json"), "-q"])
    assert result.exit_code == 1
    assert "Nothing fits under" in result.output
    assert not (tmp_path / "b.json").exists()


def test_exception_on_every_probe_stops_after_the_first_with_the_traceback(tmp_path):
    with pytest.raises(UserCodeError) as info:
        run_search(settings(tmp_path, "raises.py", budget_s=600, study="raises"))
    assert "helper_that_fails" in str(info.value) and "ValueError: bad shape" in str(info.value)
    assert len(_study_trials(tmp_path, "raises")) == 1  # did not burn the budget
    assert not (tmp_path / "best.json").exists()


@pytest.mark.slow
def test_exception_under_one_precision_marks_it_unusable_and_goes_on(tmp_path):
    # No rechecks: a noisy machine's rechecks must not use up the trials before fp16's turn. Bounded by its
    # trials (a roomy budget), so a neighbour on the other core slows it but changes nothing it checks.
    result = run_search(settings(tmp_path, "fp16_raises.py", trials=8, recheck=False, budget_s=600))
    failed = [o for o in observations(trials(tmp_path, result)) if o.status == "error"]
    assert len(failed) == 1 and failed[0].config.precision == "fp16"
    assert result.best is not None and result.best.precision != "fp16"
    assert any("fp16 is unusable here: NotImplementedError" in n for n in result.notes)
    assert {o.config.precision for o in observations(trials(tmp_path, result)) if o.status == "ok"} >= {"fp32", "bf16"}


@pytest.mark.slow
def test_segfault_in_user_code_is_crashed_and_the_search_goes_on(tmp_path):
    result = run_search(settings(tmp_path, "crashes_above.py", trials=6))
    seen = observations(trials(tmp_path, result))
    crashed = [o for o in seen if o.status == "crashed"]
    assert crashed and all(o.config.batch_size >= 8 for o in crashed)
    assert [o for o in seen if o.status == "ok" and o.config.batch_size < 8]
    assert result.best is not None and result.best.batch_size < 8
    assert any("crashed" in n and "SIGSEGV" in n for n in result.notes)


@pytest.mark.serial  # a 10 s probe timeout that the probes below batch 8 must not reach, beside nothing
@pytest.mark.slow
def test_hang_is_killed_at_the_probe_timeout_and_the_search_goes_on(tmp_path):
    result = run_search(settings(tmp_path, "hangs_above.py", trials=5, probe_timeout=10, budget_s=300))
    seen = observations(trials(tmp_path, result))
    timeouts = [t for t in trials(tmp_path, result) if t.user_attrs.get("status") == "timeout"]
    assert timeouts and all("after 10s" in t.user_attrs["probe"]["error_message"] for t in timeouts)
    assert [o for o in seen if o.status == "ok" and o.config.batch_size < 8]
    assert result.best is not None and result.best.batch_size < 8


@pytest.mark.slow  # every probe hangs (tests/scripts/hangs.py): it times out however slowly it starts, beside any test
def test_a_search_whose_every_probe_times_out_says_so_not_out_of_memory(tmp_path):
    with pytest.raises(NoFeasibleConfig) as info:
        run_search(settings(tmp_path, "hangs.py", trials=3, probe_timeout=5, budget_s=120))
    message = str(info.value)
    assert "timed out" in message and "--probe-timeout" in message
    assert "out of memory" not in message.replace("none ran out of memory", "")
    assert not (tmp_path / "best.json").exists()


@pytest.mark.slow
def test_a_leaking_function_cannot_leak_into_later_cpu_probes(tmp_path):
    """Each CPU probe runs in its own forked process: 100 MiB kept per call is gone with it."""
    result = run_search(settings(tmp_path, "leaks_search.py", trials=4))
    assert not any("leak" in n for n in result.notes)
    assert result.best is not None


@pytest.mark.slow
def test_nan_loss_makes_the_config_unusable(tmp_path):
    result = run_search(settings(tmp_path, "fp16_diverges.py", trials=8))
    seen = observations(trials(tmp_path, result))
    assert [o for o in seen if o.status == "diverged" and o.config.precision == "fp16"]
    assert result.best.precision == "fp32"


def _search_cmd(tmp_path, *extra, name: str = "grows.py"):
    return [sys.executable, "-m", "autofit.cli", "search", script(name), "--memory-limit", "768MiB",
            "--storage", f"sqlite:///{tmp_path}/s.db", "--study", "shared", "--out", str(tmp_path / "best.json"), *extra]


def _interrupting(tmp_path, moment: str | None) -> dict:
    """The environment of a search of interrupts_search.py that sends itself SIGINT at `moment`
    (None: never); every process of that search carries the count file's path in its environment."""
    env = {**os.environ, "PYTHONPATH": REPO, "AUTOFIT_TEST_INTERRUPT_COUNT": str(tmp_path / "probes")}
    env.pop("AUTOFIT_TEST_INTERRUPT", None)
    return {**env, "AUTOFIT_TEST_INTERRUPT": moment} if moment else env


def _processes_with(marker: str) -> list[str]:
    """The command lines of live processes whose environment holds `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as handle:
                    if marker.encode() not in handle.read():
                        continue
                with open(f"/proc/{entry}/stat") as stat:
                    if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    found.append(handle.read().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
    return found


def _none_left(marker: str) -> list[str]:
    """The processes still holding `marker` once the killed ones had a few seconds to go."""
    for _ in range(50):
        left = _processes_with(marker)
        if not left:
            return []
        time.sleep(0.2)
    return left


@pytest.mark.slow
def test_ctrl_c_keeps_finished_probes_exports_partial_and_resumes(tmp_path):
    """SIGINT in the middle of the fourth probe (the script sends it: no race with the search's pace)."""
    storage = f"sqlite:///{tmp_path}/s.db"
    interrupted = subprocess.run(_search_cmd(tmp_path, "--budget", "5m", name="interrupts_search.py"),
                                 capture_output=True, text=True, cwd=tmp_path, env=_interrupting(tmp_path, "probe:4"),
                                 timeout=300)
    assert interrupted.returncode == 130, interrupted.stderr
    document = json.loads((tmp_path / "best.json").read_text())
    assert document["partial"] is True
    kept = [t for t in optuna.load_study(study_name="shared", storage=storage).trials if "probe" in t.user_attrs]
    assert len(kept) == 3
    assert not [t for t in optuna.load_study(study_name="shared", storage=storage).trials
                if t.state == optuna.trial.TrialState.RUNNING]
    again = subprocess.run(_search_cmd(tmp_path, "--budget", "3m", "--trials", "2", "--json",
                                       name="interrupts_search.py"),
                           capture_output=True, text=True, cwd=tmp_path, env=_interrupting(tmp_path, None), timeout=240)
    assert again.returncode == 0, again.stderr
    # The kept probes are not spent again: no config explored twice, and the resumed search goes on
    # past them. (A kept probe may be a recheck, not an exploration, where CI's load made one suspect.)
    before = {o.config for o in observations(kept) if o.phase == "explore"}
    after = optuna.load_study(study_name="shared", storage=storage).trials
    explored = [o.config for o in observations(after) if o.phase == "explore"]
    assert len(explored) == len(set(explored)) and before <= set(explored)
    assert len([t for t in after if "probe" in t.user_attrs]) > len(kept)


@pytest.mark.parametrize(("moment", "extra", "kept", "lost_phases", "sigint_ignored"), [
    # Every phase but a probe's runs in the slow tier (the default tier stays under 5 minutes on 2 cores).
    pytest.param("worker-load", ("--no-estimate",), 0, (), False, marks=pytest.mark.slow),  # the worker loads
    # ... the memory estimator loads (beside the workers and the first probe: the search does not wait for it)
    pytest.param("estimator-load", (), None, (), False, marks=pytest.mark.slow),
    # ... it answers: the pilot's strategy before the first probe (nothing probed yet), the rest beside the probes
    pytest.param("estimate", (), None, (), False, marks=pytest.mark.slow),
    ("probe:2", ("--no-estimate",), 1, ("explore", "recheck"), False),
    # ... after exploring: one micro-batch, so the leader has no climb left and its confirmation runs
    pytest.param("probe:2", ("--no-estimate", "--trials", "1", "--batch-range", "8:8"), 1, ("remeasure", "confirm"),
                 False, marks=pytest.mark.slow),
    # As a shell starts a background job: SIGINT ignored, which Python keeps unless told otherwise.
    pytest.param("probe:2", ("--no-estimate", "--trials", "4", "--probe-timeout", "30s"), 1, ("explore", "recheck"),
                 True, marks=pytest.mark.slow),
], ids=["worker-load", "estimator-load", "estimate", "probe", "confirm", "sigint-ignored"])
def test_ctrl_c_stops_the_search_in_every_phase(tmp_path, moment, extra, kept, lost_phases, sigint_ignored):
    """Whatever the search is doing when SIGINT comes (the script sends it, then keeps that moment
    going until the search stops it): exit 130, the finished probes kept, the unfinished one FAIL,
    the best so far exported as partial, and no process of the search left behind."""
    env = _interrupting(tmp_path, moment)
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    done = subprocess.run(_search_cmd(tmp_path, "--budget", "5m", "--json", *extra, name="interrupts_search.py"),
                          capture_output=True, text=True, cwd=tmp_path, env=env, preexec_fn=ignore, timeout=300)
    assert done.returncode == 130, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["partial"] is True and summary["stopped"] == "interrupted (Ctrl-C)"
    assert not _none_left(env["AUTOFIT_TEST_INTERRUPT_COUNT"])
    storage = f"sqlite:///{tmp_path}/s.db"
    if kept is None:  # beside whatever the search was doing then: loading (no study left) or probing
        kept = summary["probes"]
        studies = {s.study_name for s in optuna.get_all_study_summaries(storage)}
        trials = optuna.load_study(study_name="shared", storage=storage).trials if "shared" in studies else []
        lost_phases = ("explore", "recheck") if any("probe" not in t.user_attrs for t in trials) else ()
        if kept == 0 and trials:  # the first probe, lost: FAIL, to be probed again on resume
            assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL]
            assert not (tmp_path / "best.json").exists()
            return
    if not kept:  # interrupted while loading: nothing probed, and the study this search made is gone
        assert "shared" not in {s.study_name for s in optuna.get_all_study_summaries(storage)}
        assert not (tmp_path / "best.json").exists()
        return
    study = optuna.load_study(study_name="shared", storage=storage)
    assert len([t for t in study.trials if "probe" in t.user_attrs]) == summary["probes"] == kept
    unfinished = [(t.state, t.user_attrs.get("phase")) for t in study.trials if "probe" not in t.user_attrs]
    if lost_phases:  # the probe SIGINT came in: FAIL, to be probed again on resume
        assert len(unfinished) == 1 and unfinished[0][0] == optuna.trial.TrialState.FAIL
        assert unfinished[0][1] in lost_phases
    else:
        assert unfinished == []
    assert "autofit_estimates" not in study.user_attrs  # an interrupted estimate is asked again on resume
    if kept:
        assert json.loads((tmp_path / "best.json").read_text())["partial"] is True
    else:
        assert not (tmp_path / "best.json").exists()


# The default storage here; a storage given as a URL (journal, PostgreSQL) in tests/integration/test_parallel.py.
@pytest.mark.parametrize("storage", ["default"])
@pytest.mark.slow
def test_two_searches_on_one_study_record_every_trial_once(tmp_path, storage):
    extra = ["--trials", "4", "--budget", "10m", "-q", "--json"]  # bounded by its probes: it runs beside another test
    cmd = _search_cmd(tmp_path, *extra)
    if storage == "default":
        i = cmd.index("--storage")
        del cmd[i:i + 2]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    url = f"sqlite:///{tmp_path}/s.db" if storage == "url" else f"sqlite:///{tmp_path}/studies/autofit.db"
    all_trials = optuna.load_study(study_name="shared", storage=url).trials
    probed = [t for t in all_trials if "probe" in t.user_attrs]
    explored = [o.config for o in observations(all_trials) if o.phase == "explore"]
    assert len(explored) == len(set(explored))  # no config explored twice, by either process
    assert not [t for t in all_trials if t.state == optuna.trial.TrialState.RUNNING]
    reported = sum(json.loads(o[0])["probes"] for o in outs)
    assert len(probed) >= 8 - 2 and reported >= len(probed)  # every finished probe is a trial


@pytest.mark.parametrize("make_storage", ["not_a_database", "unmakeable_folder"])
def test_storage_that_cannot_be_opened_fails_before_any_probe(tmp_path, monkeypatch, make_storage):
    if make_storage == "not_a_database":
        (tmp_path / "s.db").write_bytes(b"this is not sqlite" * 100)
        url = f"sqlite:///{tmp_path}/s.db"
    else:
        url = "sqlite:////proc/autofit-cannot-exist/s.db"  # unwritable even for root
    from autofit.probing import Worker

    started = []
    real_start = Worker.start
    monkeypatch.setattr(Worker, "start", lambda self: started.append(self) or real_start(self))
    result = CliRunner().invoke(cli, ["search", script("grows.py"), "--storage", url, "--budget", "1m",
                                      "--out", str(tmp_path / "b.json")])
    assert result.exit_code == 1
    assert result.output.startswith("autofit: error: The storage") and result.output.count("\n") == 1
    assert started == []  # no worker was started, no probe ran
    assert not (tmp_path / "b.json").exists()


def _running_trials(storage: str, study: str) -> list:
    import optuna

    return [t for t in optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
            if t.state == optuna.trial.TrialState.RUNNING]


@pytest.mark.serial  # killed well inside a 3.5 s probe
@pytest.mark.slow
def test_a_search_killed_mid_probe_resumes_and_probes_the_unfinished_config(tmp_path):
    """SIGKILL (or the OOM killer) gives the searcher no chance to clean up: its trial is left
    RUNNING. The same command run again fails it as stale and probes that config, without repeating
    the probes that finished."""
    import optuna

    storage = f"sqlite:///{tmp_path}/k.db"
    command = [sys.executable, "-m", "autofit.cli", "search", script("slow_above.py"), "--device", "cpu",
               "--memory-limit", "768MiB", "--budget", "90s", "--storage", storage, "--study", "k",
               "--out", str(tmp_path / "best.json"), "-q"]
    searcher = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    killed_config = None
    while time.monotonic() < deadline and killed_config is None:
        time.sleep(0.3)
        try:
            running = _running_trials(storage, "k")
        except (KeyError, Exception):  # noqa: BLE001 - the study may not exist yet
            continue
        slow = [t for t in running if t.params.get("batch_size", 0) >= 8]
        if slow:
            time.sleep(1.0)  # well inside its 3.5 s probe
            killed_config = slow[0].params
            searcher.kill()
    searcher.wait(timeout=10)
    assert killed_config is not None, "the search never reached a slow probe"
    before = optuna.load_study(study_name="k", storage=storage).get_trials(deepcopy=False)
    finished_before = [t for t in before if t.state != optuna.trial.TrialState.RUNNING]
    assert [t.params for t in before if t.state == optuna.trial.TrialState.RUNNING] == [killed_config]
    time.sleep(1.0)
    assert not [pid for pid in _worker_pids() if pid], "the killed searcher's worker must die with it"

    resumed = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    after = optuna.load_study(study_name="k", storage=storage).get_trials(deepcopy=False)
    explored = [t.params["batch_size"] for t in after
                if t.user_attrs.get("phase") == "explore" and t.user_attrs.get("status")]
    assert len(explored) == len(set(explored))  # no finished probe was repeated
    reprobed = [t for t in after[len(before):] if t.params == killed_config]
    assert reprobed and reprobed[0].user_attrs.get("status") == "ok"
    assert all(t.state != optuna.trial.TrialState.RUNNING for t in after)
    assert len(after) > len(finished_before)


def _worker_pids() -> list[int]:
    """autofit worker processes whose command line names this test's script."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if b"autofit.probing._worker_process" in handle.read():
                        with open(f"/proc/{entry}/stat") as stat:
                            if stat.read().rsplit(")", 1)[1].split()[0] != "Z":
                                pids.append(int(entry))
            except OSError:
                continue
    return pids


@pytest.mark.slow
def test_a_supervisor_failure_leaves_no_trial_running(tmp_path, monkeypatch):
    """An exception inside autofit itself (here: the pipe to the worker breaks) ends the search with
    the error, the finished probes kept and the unfinished one FAIL, to be probed again."""
    import optuna

    from autofit.probing import Worker

    calls = {"n": 0}
    real_probe = Worker.probe

    def breaking_probe(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise BrokenPipeError("the worker's socket broke")
        return real_probe(self, *args, **kwargs)

    monkeypatch.setattr(Worker, "probe", breaking_probe)
    with pytest.raises(BrokenPipeError):
        run_search(settings(tmp_path, "fits_small.py", trials=6, study="broken"))
    trials = optuna.load_study(study_name="broken", storage=f"sqlite:///{tmp_path}/s.db").get_trials()
    assert [t.state for t in trials].count(optuna.trial.TrialState.COMPLETE) == 2
    assert all(t.state != optuna.trial.TrialState.RUNNING for t in trials)


@pytest.mark.slow
def test_a_cpu_study_without_a_memory_limit_resumes(tmp_path):
    """The default CPU limit is the memory free at the start, different every run: a resumed study
    keeps the limit it began with instead of refusing to resume."""
    base = dict(script=script("fits_small.py"), budget_s=60, trials=2, storage=f"sqlite:///{tmp_path}/m.db",
                study="nolimit", out=str(tmp_path / "best.json"), batch_range=(1, 64))
    first = run_search(SearchSettings(**base))
    second = run_search(SearchSettings(**base))
    assert second.probes > first.probes
    with pytest.raises(UsageError, match="same memory limit"):
        run_search(SearchSettings(**{**base, "memory_limit": 2**30}))
