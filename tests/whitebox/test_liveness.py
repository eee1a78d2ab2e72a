"""Which running trials are dead (autofit.search._liveness): across machines, Optuna's heartbeat decides (real
PostgreSQL)."""

from __future__ import annotations

import time

import optuna
import pytest


@pytest.mark.postgres
def test_a_searcher_on_another_machine_is_dead_once_its_heartbeat_is_stale(postgres_url):
    """Across machines the owner's pid cannot be checked: Optuna's heartbeat decides. A running trial
    owned by another host is trusted while its heartbeat is fresh and failed once it is stale."""
    from autofit.search._liveness import fail_stale
    from autofit.study import engine_url, quiet_heartbeat_warnings

    with quiet_heartbeat_warnings():
        storage = optuna.storages.RDBStorage(engine_url(postgres_url), heartbeat_interval=1, grace_period=2)
        study = optuna.create_study(study_name="hosts", storage=storage, direction="maximize")
        trial = study.ask({"batch_size": optuna.distributions.IntDistribution(1, 64)})
        trial.set_user_attr("owner", {"host": "another-machine", "pid": 1, "started": "1"})
        storage.record_heartbeat(trial._trial_id)
    assert fail_stale(study) == []  # fresh heartbeat: its searcher is alive as far as anyone can tell
    assert study.trials[0].state == optuna.trial.TrialState.RUNNING
    time.sleep(3.5)
    assert fail_stale(study) == [trial.number]  # stale: failed, so its config is probed again
    assert study.trials[0].state == optuna.trial.TrialState.FAIL
