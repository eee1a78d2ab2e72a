"""Which searcher runs a trial, and what happens to trials whose searcher died: every running trial
carries its owner (host, pid, process start time) and, on storages that support it, a heartbeat;
a search that starts fails the trials of dead searchers so their configs are probed again."""

from __future__ import annotations

import os
import socket
import threading

import optuna
from optuna.trial import TrialState

from autofit.study import HEARTBEAT_S, quiet_heartbeat_warnings


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
