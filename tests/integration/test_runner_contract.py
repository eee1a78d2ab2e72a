"""The contract every probe runner keeps (autofit.probing.ProbeRunner), one suite run over each of
them, the way Optuna runs one suite over every storage: the persistent worker, two gloo ranks kept
across probes, a fresh torchrun job per probe, and a job across machines (here one machine joined
through c10d rendezvous, its jobs posted on a study's trials); the worker and the kept ranks run in both
process models (each probe forked from a warm process, or all of them in one process as on CUDA). Real
processes under a real RLIMIT_DATA cap on CPU; a runner added to RUNNERS gets every test, or those
CONTRACT_OF names for it (the rest runs in the same processes as another runner's).

Whatever the user's code does is a status in the result, never an exception, and the runner probes
again afterwards: ok, oom, error (a user exception, data too small for a probe), diverged, crashed,
timeout; memory a probe keeps does not reach the next one."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import optuna
import pytest

import autofit
from autofit.config import Config
from autofit.errors import UsageError
from autofit.export import MemoryBudget
from autofit.probing import (
    BUDGET_CUT,
    DistributedWorker,
    JobBoard,
    MultiNodeWorker,
    ProbeLimits,
    ProbeResult,
    ProbeRunner,
    RankGroup,
    Worker,
    WorkerStartError,
    free_local_port,
    make_runner,
)
from tests.support import refused_by_the_allocator, script

LIMIT = 768 * 2**20

RUNNERS = [
    pytest.param("worker", id="worker"),
    # every probe in one process, as on CUDA (slow tier: the default keeps the forked worker)
    pytest.param("worker-persistent", id="worker-persistent", marks=pytest.mark.slow),
    pytest.param("torchrun", id="torchrun-2-ranks", marks=pytest.mark.distributed),  # ranks kept across probes
    pytest.param("torchrun-persistent", id="torchrun-2-ranks-persistent", marks=pytest.mark.distributed),
    pytest.param("torchrun-fresh", id="torchrun-fresh-2-ranks", marks=pytest.mark.distributed),
    pytest.param("multinode", id="multinode-1-node", marks=pytest.mark.distributed),
]


@dataclass
class Probing:
    """A runner under test, and how it is asked for probes: each on a running trial of its own, as
    a search asks (only the runner across machines uses it)."""

    runner: ProbeRunner
    world_size: int
    study: optuna.Study

    def probe(self, batch: int, *, timeout: float = 180, **kwargs) -> ProbeResult:
        trial = self.study.ask()
        try:
            return self.runner.probe(Config(batch_size=batch), timeout=timeout, trial_id=trial._trial_id, **kwargs)
        finally:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)


#: The runner across machines holds these; the faults inside a probe (an exception, NaN, a segfault, a hang, a
#: stall, data too short, memory kept) it leaves to the same rank processes torchrun-2-ranks checks.
MULTINODE_CONTRACT = {"test_start_reports_the_function_and_what_the_device_runs",
                      "test_a_fitting_config_reports_throughput_and_a_peak_below_the_limit",
                      "test_an_oversize_config_is_oom_and_the_next_probe_runs",
                      "test_a_probe_cut_by_the_budget_is_not_measured_whatever_its_progress",
                      "test_a_script_without_the_function_is_a_usage_error_and_a_broken_one_a_start_error"}


#: The faults the rank processes of a fresh torchrun job (a probe across machines runs them) and the kept ranks
#: that run each probe in themselves (as on CUDA) handle on their own; the rest is the kept ranks' (torchrun-2-ranks).
OWN_FAULTS = {"test_a_user_exception_is_an_error_with_the_users_traceback",
              "test_a_segfault_is_crashed_with_the_stack_in_the_log_and_the_next_probe_runs"}
CONTRACT_OF = {"multinode": MULTINODE_CONTRACT,
               "torchrun-fresh": OWN_FAULTS | {"test_a_hang_is_killed_at_the_timeout_and_the_next_probe_is_killed_too"},
               "torchrun-persistent": OWN_FAULTS | {"test_memory_a_probe_keeps_does_not_reach_the_next_probe"}}


@pytest.fixture(params=RUNNERS)
def runner_for(request) -> Iterator[Callable[..., Probing]]:
    """`runner_for(SCRIPT)`: this parameter's runner for a script in tests/scripts, not started."""
    if request.function.__name__ not in CONTRACT_OF.get(request.param, {request.function.__name__}):
        pytest.skip("the same rank processes as torchrun-2-ranks' (or a fault they handle alike): checked there")
    made: list[ProbeRunner] = []

    def make(name: str) -> Probing:
        storage = optuna.storages.InMemoryStorage()
        study = optuna.create_study(storage=storage, study_name="contract")
        if request.param == "worker":
            runner, world = make_runner(script(name), budget=MemoryBudget(limit_bytes=LIMIT)), 1
        elif request.param == "worker-persistent":
            runner, world = make_runner(script(name), budget=MemoryBudget(limit_bytes=LIMIT), probe_process="persistent"), 1
        elif request.param == "torchrun":
            runner, world = make_runner(script(name), budget=MemoryBudget(limit_bytes=LIMIT), nproc=2), 2
        elif request.param == "torchrun-persistent":
            runner, world = make_runner(script(name), budget=MemoryBudget(limit_bytes=LIMIT), nproc=2, probe_process="persistent"), 2
        elif request.param == "torchrun-fresh":
            runner, world = DistributedWorker(script(name), budget=MemoryBudget(limit_bytes=LIMIT), nproc=2), 2
        else:
            board = JobBoard(storage, "contract")
            runner = MultiNodeWorker(script(name), nproc=1, nnodes=1, rdzv_endpoint=f"127.0.0.1:{free_local_port()}",
                                     budget=MemoryBudget(limit_bytes=LIMIT), board=board, session=board.open_session(1, 1))
            world = 1
        made.append(runner)
        return Probing(runner, world, study)

    yield make
    for runner in made:
        runner.close()


def test_make_runner_picks_the_runner_for_the_ranks_and_machines():
    assert type(make_runner(script("fits_small.py"))) is Worker
    assert type(make_runner(script("fits_small.py"), nproc=2)) is RankGroup
    across = make_runner(script("fits_small.py"), nproc=2, nnodes=2, rdzv_endpoint="127.0.0.1:29500")
    assert type(across) is MultiNodeWorker and across.world_size == 4
    assert all(isinstance(r, ProbeRunner) for r in (across, make_runner(script("fits_small.py"))))


def test_start_reports_the_function_and_what_the_device_runs(runner_for):
    probing = runner_for("fits_small.py")
    assert isinstance(probing.runner, ProbeRunner)
    info = probing.runner.start()
    assert probing.runner.info == info
    assert info.function == "train" and info.options["batch_range"] == (1, 2048)
    assert "fp32" in info.precisions and set(info.default_precisions) <= set(info.precisions)
    assert 0 < info.baseline_bytes < LIMIT == info.memory_limit


def test_a_fitting_config_reports_throughput_and_a_peak_below_the_limit(runner_for):
    probing = runner_for("fits_small.py")
    probing.runner.start()
    result = probing.probe(8)
    assert result.status == "ok", result.error_message
    assert result.world_size == probing.world_size
    assert result.samples_per_s > 0 and result.step_time_median_s > 0
    assert result.measured_steps >= 5  # more when five steps take less than the minimum measured time
    assert 0 < result.peak_bytes < LIMIT == result.memory_limit
    assert result.knobs["autocast"] and result.knobs["backward"] and result.knobs["checkpoint_blocks"] == 4


def test_an_oversize_config_is_oom_and_the_next_probe_runs(runner_for):
    probing = runner_for("fits_small.py")
    probing.runner.start()
    oom = probing.probe(1024)  # 1 GiB of activations under a 768 MiB cap
    assert oom.status == "oom", oom.error_message
    assert refused_by_the_allocator(oom.error_message) or oom.error_type == "MemoryError"
    assert probing.probe(8).status == "ok"


def test_a_user_exception_is_an_error_with_the_users_traceback(runner_for):
    probing = runner_for("raises.py")
    probing.runner.start()
    result = probing.probe(3)
    assert result.status == "error" and result.error_type == "ValueError"
    assert "bad shape 3" in result.error_message
    assert "helper_that_fails" in result.traceback and "raises.py" in result.traceback
    assert os.path.dirname(autofit.__file__) not in result.traceback  # autofit's own frames are left out


def test_a_nan_loss_is_diverged(runner_for):
    probing = runner_for("diverges.py")
    probing.runner.start()
    assert probing.probe(2).status == "diverged"


def test_data_too_small_for_a_probe_says_so(runner_for):
    probing = runner_for("data_too_small.py")
    probing.runner.start()
    empty = probing.probe(32)  # drop_last: 16 samples yield no batch of 32
    assert empty.status == "error" and empty.error_type == "DataTooSmall"
    short = probing.probe(4)  # one pass gives 4 steps; a probe needs 2 + 5
    assert short.status == "error" and short.error_type == "ProbeTooShort"
    assert "needs 7" in short.error_message


def test_a_segfault_is_crashed_with_the_stack_in_the_log_and_the_next_probe_runs(runner_for, tmp_path):
    probing = runner_for("crashes.py")
    probing.runner.start()
    log = str(tmp_path / "probe.log")
    crashed = probing.probe(8, log_path=log)
    assert crashed.status == "crashed"
    assert crashed.error_type in ("WorkerCrashed", "RankCrashed")
    assert crashed.log_path == log
    with open(log) as handle:
        assert "Segmentation fault" in handle.read()  # faulthandler's report of the process that crashed
    assert "Segmentation fault" in crashed.traceback or "SIGSEGV" in crashed.traceback  # the log's tail
    assert probing.probe(2).status == "ok"


def test_a_hang_is_killed_at_the_timeout_and_the_next_probe_is_killed_too(runner_for, monkeypatch):
    """Killed with every process it started: torchrun's ranks (each in a session of its own) used to live on,
    hung, after torchrun was SIGKILLed at the timeout. hangs.py hangs in its first micro-batch: its start
    never ends."""
    mark = f"{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv("AUTOFIT_TEST_RANKS_OF", mark)  # the ranks of this test's probes, not another test's
    probing = runner_for("hangs.py")
    probing.runner.start()
    before = _rank_processes(mark)
    for _ in range(2):  # the runner is usable after a probe it had to kill
        result = probing.probe(1, timeout=2)
        assert result.status == "timeout" and result.error_type == "StartTimeout"
        assert "first micro-batch after 2s" in result.error_message and "--probe-timeout" in result.error_message
        assert result.memory_limit == LIMIT
    deadline = time.monotonic() + 10
    while (left := _rank_processes(mark) - before) and time.monotonic() < deadline:
        time.sleep(0.2)  # SIGKILL from the kernel as torchrun dies; gone within moments
    assert not left, f"rank processes outlived their probe: {sorted(left)}"


@pytest.mark.slow  # the hang above keeps the [worker] case of the limits in the default tier
def test_a_probe_is_killed_when_its_steps_stop_progressing_not_while_its_start_runs(runner_for):
    """A start (set-up, compilation) gets its own limit; steps are killed when they stop making progress:
    stalls.py runs three micro-batches, then one never ends."""
    probing = runner_for("stalls.py")
    probing.runner.start()
    result = probing.probe(1, timeout=ProbeLimits(start_s=120, stall_s=3))
    assert result.status == "timeout" and result.error_type == "Timeout"
    assert "no progress for 3s" in result.error_message and "3 micro-batches" in result.error_message
    assert result.wall_s < 60  # killed for its stall, long before its start's limit


@pytest.mark.slow
def test_a_probe_cut_by_the_budget_is_not_measured_whatever_its_progress(runner_for):
    """The budget's end (`total_s`) stops even a probe that is making progress, and says so: no verdict."""
    probing = runner_for("stalls.py")
    probing.runner.start()
    result = probing.probe(1, timeout=ProbeLimits(start_s=120, stall_s=120, total_s=4))
    assert result.status == "timeout" and result.error_type == BUDGET_CUT
    assert "not measured" in result.error_message


def _rank_processes(mark: str) -> set[int]:
    """The live processes running a distributed probe's rank (autofit.probing._rank_process, or a kept rank
    of autofit.probing._rank_server and the probes forked from it) whose
    environment carries AUTOFIT_TEST_RANKS_OF=mark: under pytest-xdist, the other worker's test starts ranks too."""
    found = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read()
            with open(f"/proc/{entry}/stat") as handle:
                zombie = handle.read().rsplit(")", 1)[1].split()[0] == "Z"
            with open(f"/proc/{entry}/environ", "rb") as handle:
                ours = f"AUTOFIT_TEST_RANKS_OF={mark}".encode() in handle.read().split(b"\0")
        except (OSError, IndexError):
            continue
        if (b"autofit.probing._rank_process" in command or b"autofit.probing._rank_server" in command) \
                and not zombie and ours:
            found.add(int(entry))
    return found


def test_memory_a_probe_keeps_does_not_reach_the_next_probe(runner_for):
    """leaks.py keeps 200 MiB per call in a module-level list: the next probe starts from the same
    baseline (a CPU probe runs in a process forked for it; a torchrun job starts fresh ranks)."""
    probing = runner_for("leaks.py")
    probing.runner.start()
    first, second = probing.probe(2), probing.probe(2)
    assert first.status == second.status == "ok"
    assert not second.notes
    assert abs(second.peak_bytes - first.peak_bytes) < 32 * 2**20


def test_a_script_without_the_function_is_a_usage_error_and_a_broken_one_a_start_error(runner_for):
    with pytest.raises(UsageError, match="decorated with @autofit"):
        runner_for("no_function.py").runner.start()
    with pytest.raises(WorkerStartError, match="broken at import") as info:
        runner_for("import_error.py").runner.start()
    assert "import_error.py" in info.value.traceback
