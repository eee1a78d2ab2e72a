"""The Run a script's `autofit.start` takes: the one offered (a probe's), once; at load, the call's
arguments and no further; nothing left for the next run."""
from __future__ import annotations

import pytest

import autofit
from autofit.errors import UsageError
from autofit.options import SearchOptions
from autofit.runtime import ONE_START, Run, StartReached, offer_script_run, take_script_run


def test_the_offered_run_is_taken_once():
    run = Run(autofit.Config(batch_size=4), "cpu", probing=True)
    with offer_script_run(run):
        assert autofit.start(global_batch=8) is run
        with pytest.raises(UsageError, match="called it a second time"):
            autofit.start(global_batch=8)
    assert take_script_run(SearchOptions()) is None  # nothing offered any more: a normal run builds its own


def test_a_new_offer_starts_afresh():
    for batch in (4, 8):
        run = Run(autofit.Config(batch_size=batch), "cpu", probing=True)
        with offer_script_run(run):
            assert take_script_run(SearchOptions()).batch_size == batch


def test_at_load_start_stops_the_script_with_its_arguments():
    with offer_script_run(None), pytest.raises(StartReached) as reached:
        autofit.start(global_batch=64, precision="bf16", batch_range=(2, 32))
    assert reached.value.options == SearchOptions(global_batch=64, precision=("bf16",), batch_range=(2, 32))
    assert not isinstance(reached.value, Exception)  # past a script's `except Exception`


def test_the_message_names_the_rule():
    assert ONE_START.startswith("A script must call autofit.start once")
