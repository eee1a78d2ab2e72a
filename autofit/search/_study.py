"""The Optuna side: storage, study naming, and the mapping between probes and trials."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import warnings
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from autofit.errors import StorageError
from autofit.record import ProbeResult
from autofit.search._observation import Observation
from autofit.space import PRECISIONS, Config

#: A searcher records a heartbeat on its running trial this often (RDB storages: SQLite, PostgreSQL,
#: MySQL); a running trial without one for STALE_AFTER_S belonged to a searcher that died.
HEARTBEAT_S = 10
STALE_AFTER_S = 60

DEFAULT_DIR = "studies"
DEFAULT_DB = "autofit.db"
#: Errors that say the data cannot feed a batch this large (a ceiling, not a fault of the code).
DATA_BOUND_ERRORS = ("ProbeTooShort", "DataTooSmall")
#: Probes that ran (fit or not) are COMPLETE trials: the samplers learn from OOMs too.
_COMPLETE_STATUSES = ("ok", "oom")


def default_storage_url(directory: str = DEFAULT_DIR) -> str:
    return "sqlite:///" + os.path.abspath(os.path.join(directory, DEFAULT_DB))


def open_storage(url: str | None) -> optuna.storages.BaseStorage:
    """An Optuna storage, or a StorageError saying why it cannot be used (before any probe runs)."""
    url = url or default_storage_url()
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        directory = os.path.dirname(os.path.abspath(path)) or "."
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"The storage {url} must be writable, but its folder cannot be made: {exc.strerror}.") from None
        if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
            raise StorageError(f"The storage {url} must be writable, but {path} is not.")
    for attempt in range(3):
        try:
            if url.endswith(".journal") or url.endswith(".log"):
                from optuna.storages.journal import JournalFileBackend

                return optuna.storages.JournalStorage(JournalFileBackend(url))
            kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
            with quiet_heartbeat_warnings():
                return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S,
                                                  grace_period=STALE_AFTER_S)
        except Exception as exc:  # noqa: BLE001 - any driver error means the same thing to the user
            # Two searches creating the same new database race on its schema: the loser retries.
            racing = ("UNIQUE constraint failed", "already exists", "database is locked")
            if attempt < 2 and any(text in str(exc) for text in racing):
                time.sleep(0.5 + attempt)
                continue
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StorageError(f"The storage {url} must open, but it failed: {first[:300]}") from None
    raise AssertionError("unreachable")


@contextlib.contextmanager
def quiet_heartbeat_warnings():
    """autofit records heartbeats itself (Heartbeat below) while it asks and tells trials one by one:
    Optuna's warnings that heartbeats are experimental and meant for Study.optimize do not apply."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        yield


def storage_label(url: str | None) -> str:
    return url or default_storage_url()


def default_study_name(script: str, function: str | None, device: str, index: int) -> str:
    stem = os.path.splitext(os.path.basename(script))[0]
    return f"{stem}.{function or 'train'}-{device}{index}"


def distributions(batch_range: tuple[int, int], max_checkpoint: int, max_accumulation: int) -> dict[str, BaseDistribution]:
    """The trial parameters. Integer ranges, so a study may widen them later (Optuna allows that)."""
    return {
        "batch_size": IntDistribution(batch_range[0], max(batch_range[0], batch_range[1])),
        "precision": CategoricalDistribution(PRECISIONS),
        "checkpoint_segments": IntDistribution(0, max(0, max_checkpoint)),
        "accumulation_steps": IntDistribution(1, max(1, max_accumulation)),
    }


def config_params(config: Config) -> dict[str, Any]:
    """The trial parameters of a config: the config's own fields."""
    return config.to_dict()


def trial_config(trial: FrozenTrial) -> Config | None:
    return Config.from_dict(trial.params) if "batch_size" in trial.params else None


def trial_result(trial: FrozenTrial) -> ProbeResult | None:
    data = trial.user_attrs.get("probe")
    return ProbeResult.from_dict(data) if data else None


def observations(trials: list[FrozenTrial], exclude: int | None = None) -> list[Observation]:
    """What the planner may know: finished probes, and configs other workers are probing now."""
    out = []
    for trial in trials:
        if trial.number == exclude or trial.user_attrs.get("duplicate"):
            continue
        config = trial_config(trial)
        if config is None:
            continue
        if trial.state == TrialState.RUNNING:
            out.append(Observation(config, "running", phase=trial.user_attrs.get("phase", "explore")))
            continue
        result = trial_result(trial)
        if result is None:
            continue  # interrupted before it measured anything: probe it again
        spread = (result.step_time_iqr_s / result.step_time_median_s
                  if result.step_time_iqr_s is not None and result.step_time_median_s else None)
        out.append(Observation(config, result.status, result.peak_bytes, result.samples_per_s,
                               result.wall_s, trial.user_attrs.get("phase", "explore"), spread,
                               result.only_just_fits, result.error_type in DATA_BOUND_ERRORS))
    return out


def record_probe(study: optuna.Study, trial: optuna.Trial, result: ProbeResult, usable_bytes: float, phase: str) -> FrozenTrial:
    """Store the whole probe on its trial; OOM and over-headroom are infeasible COMPLETE trials."""
    trial.set_user_attr("probe", result.to_dict())
    trial.set_user_attr("phase", phase)
    trial.set_user_attr("status", result.status)
    if result.status in _COMPLETE_STATUSES:
        if result.status == "oom":
            violation = max(1.0, float(result.limit_bytes or usable_bytes) - usable_bytes)
        else:
            violation = float(result.peak_bytes or 0) - usable_bytes
        trial.set_constraint("memory", violation)
        return study.tell(trial, result.samples_per_s or 0.0)
    return study.tell(trial, state=TrialState.FAIL)


# --- who runs a trial, and trials whose searcher died ----------------------------------------------
def _process_start(pid: int) -> str | None:
    """The start time of `pid` in clock ticks since boot (tells a pid apart from its reuse)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_record() -> dict:
    """Who is probing a trial: this host and process, recorded on the trial when it starts."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": _process_start(os.getpid())}


def owner_alive(owner: dict | None) -> bool:
    """Whether the searcher that owns a running trial is alive. Only a searcher on this host can be
    checked: one on another host is trusted until its heartbeat goes stale (fail_stale)."""
    if not owner or owner.get("host") != socket.gethostname():
        return True
    return _process_start(int(owner["pid"])) == owner.get("started")


def fail_stale(study: optuna.Study) -> list[int]:
    """Fail the running trials whose searcher died (SIGKILL, OOM-kill, a power cut), so that their
    configs are probed again: those of a dead process on this host at once, and, on storages with
    heartbeats, any whose heartbeat is older than STALE_AFTER_S. Returns their numbers."""
    with quiet_heartbeat_warnings():
        before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        optuna.storages.fail_stale_trials(study)
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not owner_alive(trial.user_attrs.get("owner")):
            try:
                study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
            except (ValueError, RuntimeError):
                continue
    still = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    failed = sorted(before - still)
    return failed


class Heartbeat:
    """Records a heartbeat on one running trial every HEARTBEAT_S while a probe runs (storages that
    support it), so that other searchers can tell a live trial from a dead searcher's."""

    def __init__(self, study: optuna.Study, trial: optuna.Trial) -> None:
        storage = study._storage  # the storage the study was opened with (no public accessor)
        self._storage = storage if hasattr(storage, "record_heartbeat") and \
            getattr(storage, "get_heartbeat_interval", lambda: None)() else None
        self._trial_id = trial._trial_id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        if self._storage is not None:
            self._thread = threading.Thread(target=self._beat, daemon=True)
            self._thread.start()
        return self

    def _beat(self) -> None:
        while True:
            try:
                self._storage.record_heartbeat(self._trial_id)
            except Exception:  # noqa: BLE001 - a missed heartbeat must not break the probe
                pass
            if self._stop.wait(HEARTBEAT_S):
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
