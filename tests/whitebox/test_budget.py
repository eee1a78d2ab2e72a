"""The search's budget (autofit.search._budget): how long it expects the next probe to take."""

from __future__ import annotations

import optuna
import pytest

from autofit.config import Config
from autofit.search import SearchSettings
from tests.support import script


def test_the_budget_expects_a_compiled_probe_to_take_as_long_as_the_compiled_ones_did():
    """Compilation lands in a compiled probe's warm-up: the eager probes' walls would under-estimate it
    and start a probe the budget cannot hold."""
    from autofit.planner import Observation
    from autofit.search import SearchSettings
    from autofit.search._budget import Budget

    budget = Budget(SearchSettings(script="train.py", budget_s=60), started=0.0)
    eager, compiled = Config(batch_size=8), Config(batch_size=8, compile=True)
    seen = [Observation(eager, "ok", wall_s=2.0), Observation(compiled, "ok", wall_s=40.0),
            Observation(Config(batch_size=16), "ok", wall_s=3.0), Observation(Config(batch_size=32), "ok", wall_s=4.0),
            Observation(Config(batch_size=64), "ok", wall_s=5.0)]
    assert budget.next_probe_estimate(seen) == 5.0  # the last three probes, eager
    assert budget.next_probe_estimate(seen, Config(batch_size=16, compile=True)) == 40.0
    assert budget.next_probe_estimate(seen[:1], compiled) == 2.0  # none compiled yet: nothing better known


def test_confirmation_estimate_counts_accumulation_once(tmp_path):
    """A probe's step time is per optimizer step (all its micro-batches): the estimate of a longer
    run must not multiply it by the accumulation steps again (it once predicted 1450 s for 52 s)."""
    from autofit.probing import ProbeResult
    from autofit.search._budget import Budget
    from autofit.study import open_storage, record_probe

    config = Config(batch_size=4, accumulation_steps=32)
    storage = f"sqlite:///{tmp_path}/e.db"
    study = optuna.create_study(study_name="e", storage=open_storage(storage), direction="maximize")
    trial = study.ask()
    trial.suggest_int("batch_size", 4, 4)
    trial.suggest_categorical("precision", ["fp32"])
    trial.suggest_int("checkpoint_segments", 0, 0)
    trial.suggest_int("accumulation_steps", 32, 32)
    result = ProbeResult(status="ok", config=config, samples_per_s=100.0, step_time_median_s=1.0,
                         warmup_steps=2, measured_steps=5, wall_s=10.0, peak_bytes=2**20)
    record_probe(study, trial, result, usable_bytes=2**30, phase="explore")
    budget = Budget(SearchSettings(script=script("fits_small.py"), storage=storage), started=0.0)
    assert budget.confirm_estimate(study, config, 50) == pytest.approx(10.0 + 45 * 1.0)


def test_the_decision_reserve_holds_the_contenders_second_probes_and_the_a_b_rounds(tmp_path):
    """Exploring stops early enough for the decision: b=32, 8% behind b=64 (within the noise), needs a
    second probe, and both need their A/B rounds; all of it estimated from their probes' walls and
    step times, at most a third of the budget."""
    from autofit.findings import observations
    from autofit.planner import Planner, SearchSpace
    from autofit.probing import ProbeResult
    from autofit.search._budget import Budget
    from autofit.study import open_storage, record_probe

    storage = f"sqlite:///{tmp_path}/r.db"
    study = optuna.create_study(study_name="r", storage=open_storage(storage), direction="maximize")
    for batch, rate in ((64, 100.0), (32, 92.0), (16, 50.0)):
        trial = study.ask()
        trial.suggest_int("batch_size", batch, batch)
        trial.suggest_categorical("precision", ["fp32"])
        trial.suggest_int("checkpoint_segments", 0, 0)
        trial.suggest_int("accumulation_steps", 1, 1)
        result = ProbeResult(status="ok", config=Config(batch_size=batch), samples_per_s=rate, step_time_median_s=1.0,
                             step_time_iqr_s=0.01, warmup_steps=2, measured_steps=5, wall_s=10.0, peak_bytes=2**20)
        record_probe(study, trial, result, usable_bytes=2**30, phase="explore")
    seen = observations(study.get_trials())
    planner = Planner(SearchSpace.build(batch_range=(8, 64), precisions=("fp32",)), 2**30)
    settings = dict(script=script("fits_small.py"), storage=storage, steps=5, confirm_factor=10)
    budget = Budget(SearchSettings(budget_s=3600, **settings), started=0.0)
    # second probes of b=64 and b=32 (10 steps: 10 s + 5 x 1 s each), then 3 rounds of each (20 steps: 25 s)
    assert budget.decision_reserve(planner, seen, study) == pytest.approx(2 * 15.0 + 2 * 3 * 25.0)
    short = Budget(SearchSettings(budget_s=300, **settings), started=0.0)
    assert short.decision_reserve(planner, seen, study) == pytest.approx(100.0)
