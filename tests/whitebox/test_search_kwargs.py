"""`train.search(...)` from Python takes a knob's list of values to consider by the knob's name, as `@autofit(...)`
and the command line do (`checkpoint_policy="full"`, `sharding=("ddp", "fsdp")`), into SearchSettings.consider."""

from __future__ import annotations

from autofit import autofit


@autofit
def train(run):
    return None


def test_train_search_takes_the_knobs_lists_by_their_names(monkeypatch):
    seen = []
    monkeypatch.setattr("autofit.search._api.run_search", lambda settings, reporter: seen.append(settings))
    train.search(budget="1m", checkpoint_policy="full", sharding=("ddp", "fsdp"), nproc_per_node=2)
    assert seen[0].consider == {"checkpoint_policy": ("full",), "sharding": ("ddp", "fsdp")}
    assert seen[0].budget_s == 60
