"""A search session (autofit.search._session) names its study after the function searched."""

from __future__ import annotations

import textwrap

from autofit.search import SearchSettings
from autofit.search._session import Session


def _script(tmp_path, body: str):
    path = tmp_path / "hf_user.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_a_search_names_its_study_after_the_function(tmp_path):
    path = _script(tmp_path, "from autofit import autofit\n\n@autofit\ndef main(run):\n    pass\n")
    storage = f"sqlite:///{tmp_path / 'autofit.db'}"
    session = Session(SearchSettings(script=path, device="cpu", memory_limit=2**30, storage=storage))
    assert session.study_name == "hf_user.main-cpu0"
    named = Session(SearchSettings(script=path, function="other", device="cpu", memory_limit=2**30, storage=storage))
    assert named.study_name == "hf_user.other-cpu0"


def test_of_two_searchers_asking_for_one_config_the_later_trial_waits_for_the_earlier_s_params(tmp_path):
    """Optuna creates a trial, then writes its params: a searcher whose later trial is checked in between
    must wait for them, or both racers keep the config (a config explored twice, seen in CI)."""
    import threading
    import time

    import optuna

    from autofit.config import Config
    from autofit.study import config_params, distributions

    path = _script(tmp_path, "from autofit import autofit\n\n@autofit\ndef main(run):\n    pass\n")
    session = Session(SearchSettings(script=path, device="cpu", memory_limit=2**30,
                                     storage=f"sqlite:///{tmp_path / 'autofit.db'}"))
    session.study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'race.db'}", study_name="race")
    config = Config(batch_size=16)
    dists = distributions((1, 64), 0, 1)
    first = session.study.ask()  # created; its searcher has not written its params yet
    second = session.study.ask()

    def write_params() -> None:  # as Optuna does: one by one, in the order of the study's distributions
        values = config_params(config)
        for name, distribution in dists.items():
            time.sleep(0.2)  # a claim check in between must not read a partial config (seen under load in CI)
            session.study._storage.set_trial_param(first._trial_id, name, distribution.to_internal_repr(values[name]),
                                                   distribution)

    writer = threading.Thread(target=write_params)
    writer.start()
    assert session._claimed_earlier(second.number, config)  # it waited, then saw the earlier claim
    writer.join()
    assert not session._claimed_earlier(first.number, config)  # the earlier trial keeps the config


def test_the_confirmation_factor_comes_from_the_environment_and_bad_values_are_one_clear_error(tmp_path, monkeypatch):
    import pytest

    from autofit.errors import UsageError

    path = _script(tmp_path, "from autofit import autofit\n\n@autofit\ndef main(run):\n    pass\n")
    monkeypatch.delenv("AUTOFIT_CONFIRM_FACTOR", raising=False)
    assert SearchSettings(script=path).confirm_factor == 10
    monkeypatch.setenv("AUTOFIT_CONFIRM_FACTOR", "4")
    assert SearchSettings(script=path).confirm_factor == 4
    assert SearchSettings(script=path, confirm_factor=7).confirm_factor == 7  # given beats the environment
    for bad in ("ten", "0"):
        monkeypatch.setenv("AUTOFIT_CONFIRM_FACTOR", bad)
        with pytest.raises(UsageError, match="AUTOFIT_CONFIRM_FACTOR"):
            SearchSettings(script=path)


def test_a_param_less_trial_is_waited_for_only_while_it_is_being_asked():
    """A searcher that died between asking and writing params left a trial nobody will complete: claims
    do not wait on it (the liveness check fails it), only on one created a moment ago."""
    from datetime import datetime, timedelta

    import optuna

    from autofit.search._session import _being_asked

    def trial(started: datetime, params: dict) -> optuna.trial.FrozenTrial:
        return optuna.trial.FrozenTrial(number=0, state=optuna.trial.TrialState.RUNNING, value=None,
                                        datetime_start=started, datetime_complete=None, params=params,
                                        distributions={k: optuna.distributions.IntDistribution(1, 64) for k in params},
                                        user_attrs={}, system_attrs={}, intermediate_values={}, trial_id=0)

    assert _being_asked(trial(datetime.now(), {}))
    assert not _being_asked(trial(datetime.now() - timedelta(minutes=1), {}))
    assert not _being_asked(trial(datetime.now(), {"batch_size": 16}))


def test_a_search_without_a_limit_takes_the_default_its_help_states(tmp_path, monkeypatch):
    """--help: "a GPU's whole memory; on the CPU, the memory free when the search starts, shared among --parallel
    probes" (issue 54: it said "the whole device" while a CPU search took 20.75 of 23.54 GiB)."""
    from autofit.devices import DeviceInfo

    path = _script(tmp_path, "from autofit import autofit\n\n@autofit\ndef main(run):\n    pass\n")
    storage = f"sqlite:///{tmp_path / 'autofit.db'}"
    cpu = DeviceInfo("cpu", 0, "a CPU", 24 * 2**30, 20 * 2**30)
    monkeypatch.setattr("autofit.search._session.check_device", lambda device, index: cpu)
    assert Session(SearchSettings(script=path, device="cpu", storage=storage)).memory_budget.limit_bytes == 20 * 2**30
    shared = Session(SearchSettings(script=path, device="cpu", parallel=2, storage=storage))
    assert shared.memory_budget.limit_bytes == 10 * 2**30  # each worker its share
    gpu = DeviceInfo("cuda", 0, "NVIDIA H100 80GB HBM3", 80 * 2**30, 70 * 2**30)
    monkeypatch.setattr("autofit.search._session.check_device", lambda device, index: gpu)
    on_gpu = Session(SearchSettings(script=path, device="cuda", storage=storage))
    assert on_gpu.memory_budget.limit_bytes == 80 * 2**30  # the whole card, not what is free
