"""The search's budget (autofit.search._time_budget): how long it expects the next probe to take."""

from __future__ import annotations

import time

import optuna
import pytest

from autofit.config import Config
from autofit.search import SearchSettings
from tests.support import script


def test_the_budget_expects_a_compiled_probe_to_take_as_long_as_the_compiled_ones_did():
    """Compilation lands in a compiled probe's warm-up: the eager probes' walls would under-estimate it
    and start a probe the budget cannot hold (probes without a measured step: their walls)."""
    from autofit.planner import Observation
    from autofit.search import SearchSettings
    from autofit.search._time_budget import TimeBudget

    budget = TimeBudget(SearchSettings(script="train.py", budget_s=60), started=0.0)
    eager, compiled = Config(batch_size=8), Config(batch_size=8, compile=True)
    seen = [Observation(eager, "ok", wall_s=2.0), Observation(compiled, "ok", wall_s=40.0),
            Observation(Config(batch_size=16), "ok", wall_s=3.0), Observation(Config(batch_size=32), "ok", wall_s=4.0),
            Observation(Config(batch_size=64), "ok", wall_s=5.0)]
    assert budget.next_probe_estimate(seen) == 5.0  # the last three probes, eager
    assert budget.next_probe_estimate(seen, Config(batch_size=16, compile=True)) == 40.0
    assert budget.next_probe_estimate(seen[:1], compiled) == 2.0  # none compiled yet: nothing better known


def test_the_next_probe_is_priced_by_what_it_costs_its_start_and_its_micro_batches():
    """nanoGPT's defaults on an H100: a 36 s start (compilation) and micro-batches whose cost falls per sample
    with their size. A probe of b=4 acc=120 costs its start and 4 micro-batches a step, not the 7 whole steps
    of 120 (23 s) that made it the longest probe of the search; a compiled probe's start is a compiled one's."""
    from autofit.planner import Observation
    from autofit.search import SearchSettings
    from autofit.search._time_budget import TimeBudget

    budget = TimeBudget(SearchSettings(script="train.py", budget_s=180, steps=5, warmup=2), started=0.0)
    b16 = Config(batch_size=16, precision="bf16", accumulation_steps=30, compile=False)
    seen = [Observation(b16, "ok", wall_s=45.0, start_s=36.0, step_s=0.2, ran_accumulation=4, rate=400.0)]
    # per sample: 0.2 s / (16 x 4); b=48 acc=10 runs 4 micro-batches a step: 0.6 s; 2 steps measured (8 of
    # them >= 5), 2 warm-up and the counted one: 36 + 2 x 0.6 + 3 x 0.6
    assert budget.next_probe_estimate(seen, Config(batch_size=48, precision="bf16", accumulation_steps=10)) == pytest.approx(39.0)
    # a config of acc=1 runs its one micro-batch a step: 5 measured steps of 0.6 s
    assert budget.next_probe_estimate(seen, Config(batch_size=480, precision="bf16")) == pytest.approx(36.0 + (5 + 3) * 0.2 / 64 * 480)
    # a compiled config: no compiled start seen yet, so the longest start of any
    assert budget.next_probe_estimate(seen, Config(batch_size=48, precision="bf16", accumulation_steps=10, compile=True)) == \
        pytest.approx(39.0)


def test_a_token_cap_is_priced_by_token_probes_never_by_the_pilot_by_samples():
    """A token function's pilot ran by samples (its knobs came after it): its seconds per sample priced a cap
    of 256 tokens as 256 samples (64x the pilot's step of 4 samples of 256 tokens), and a 2-minute search
    stopped at once with nothing it could export. A cap is priced by the probes by tokens, else by walls."""
    from autofit.planner import Observation
    from autofit.search import SearchSettings
    from autofit.search._time_budget import TimeBudget

    budget = TimeBudget(SearchSettings(script="train.py", budget_s=120, steps=5, warmup=2), started=0.0)
    pilot = Observation(Config(batch_size=4), "ok", wall_s=8.0, start_s=2.0, step_s=1.0, ran_accumulation=1, rate=4.0)
    cap = Config(batch_size=256, max_tokens=256)
    assert budget.next_probe_estimate([pilot], cap) == 8.0  # the walls: nothing by tokens ran a step
    by_tokens = Observation(Config(batch_size=512, max_tokens=512), "ok", wall_s=9.0, start_s=2.0, step_s=0.5,
                            ran_accumulation=1, rate=1000.0)
    # per token: 0.5 s / 512; 5 measured steps at 0.25 s, 2 warm-up and the counted one
    assert budget.next_probe_estimate([pilot, by_tokens], cap) == pytest.approx(2.0 + max(0.5, 5 * 0.25) + 3 * 0.25)


def test_a_probe_is_killed_for_its_start_or_its_stalls_never_past_the_budget():
    from autofit.planner import Observation
    from autofit.search import SearchSettings
    from autofit.search._time_budget import TimeBudget

    budget = TimeBudget(SearchSettings(script="train.py", budget_s=180), started=time.monotonic())
    first = budget.probe_limits([], Config(batch_size=4, accumulation_steps=120))
    assert first.start_s == pytest.approx(180, abs=2) and first.total_s == pytest.approx(180, abs=2)  # all of it
    assert first.stall_s == 60.0
    seen = [Observation(Config(batch_size=16, accumulation_steps=30), "ok", wall_s=45.0, start_s=36.0, step_s=0.2)]
    later = budget.probe_limits(seen, Config(batch_size=48, accumulation_steps=10))
    assert later.start_s == pytest.approx(108.0)  # 3x the longest start seen
    timed_out = Observation(Config(batch_size=48, accumulation_steps=10), "timeout", wall_s=108.0)
    again = budget.probe_limits([*seen, timed_out], Config(batch_size=48, accumulation_steps=10))
    assert again.start_s == again.stall_s == pytest.approx(again.total_s)  # probed again: all the budget left
    fixed = TimeBudget(SearchSettings(script="train.py", budget_s=180, probe_timeout=30), started=time.monotonic())
    assert (fixed.probe_limits(seen).start_s, fixed.probe_limits(seen).stall_s) == (30, 30)


def test_a_confirmation_of_the_leader_alone_takes_a_quarter_of_the_budget_at_most(tmp_path):
    """The H100 run: a one-entrant "confirmation" of b=16 took 76 s of a 150 s budget. One config measured
    longer is no A/B: a quarter of the budget at most, the longest that fits it."""
    from autofit.probing import ProbeResult
    from autofit.search._time_budget import TimeBudget
    from autofit.study import open_storage, record_probe

    storage = f"sqlite:///{tmp_path}/q.db"
    study = optuna.create_study(study_name="q", storage=open_storage(storage), direction="maximize")
    config = Config(batch_size=16, accumulation_steps=30)
    trial = study.ask()
    trial.suggest_int("batch_size", 16, 16)
    trial.suggest_categorical("precision", ["fp32"])
    trial.suggest_int("checkpoint_segments", 0, 0)
    trial.suggest_int("accumulation_steps", 30, 30)
    record_probe(study, trial, ProbeResult(status="ok", config=config, samples_per_s=100.0, step_time_median_s=4.8,
                                           probe_step_s=1.0, probe_accumulation=4, warmup_steps=2, measured_steps=2,
                                           wall_s=30.0, peak_bytes=2**20), usable_bytes=2**30, phase="explore")
    budget = TimeBudget(SearchSettings(script=script("fits_small.py"), storage=storage, budget_s=150, steps=5,
                                   confirm_factor=10), started=time.monotonic())
    plan = budget.ab_plan(study, [config])
    assert plan is not None and plan.entrants == (config,)
    assert budget.ab_estimate(study, plan) <= 150 / 4 < 150 and plan.steps < 10 * 5
    roomy = TimeBudget(SearchSettings(script=script("fits_small.py"), storage=storage, budget_s=1500, steps=5,
                                  confirm_factor=10), started=time.monotonic())
    assert roomy.ab_plan(study, [config]).steps == 10 * 5  # room for the whole confirmation: all of it


def test_confirmation_estimate_counts_accumulation_once(tmp_path):
    """A probe's step time is per optimizer step (all its micro-batches): the estimate of a longer
    run must not multiply it by the accumulation steps again (it once predicted 1450 s for 52 s). A probe's
    length is asked in micro-batches and a probe of acc=32 runs 4 a step: 50 of them are 13 steps."""
    from autofit.probing import ProbeResult
    from autofit.search._time_budget import TimeBudget
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
    budget = TimeBudget(SearchSettings(script=script("fits_small.py"), storage=storage), started=0.0)
    assert budget.confirm_estimate(study, config, 50) == pytest.approx(10.0 + (13 - 5) * 1.0)


def test_the_decision_reserve_holds_the_contenders_second_probes_and_the_a_b_rounds(tmp_path):
    """Exploring stops early enough for the decision: b=32, 8% behind b=64 (within the noise: steps that
    spread 20%), needs a
    second probe, and both need their A/B rounds; all of it estimated from their probes' walls and
    step times, at most a third of the budget."""
    from autofit.findings import observations
    from autofit.planner import Planner, SearchSpace
    from autofit.probing import ProbeResult
    from autofit.search._time_budget import TimeBudget
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
                             step_time_iqr_s=0.2, warmup_steps=2, measured_steps=5, wall_s=10.0, peak_bytes=2**20)
        record_probe(study, trial, result, usable_bytes=2**30, phase="explore")
    seen = observations(study.get_trials())
    planner = Planner(SearchSpace.build(batch_range=(8, 64), precision=("fp32",)), 2**30)
    settings = dict(script=script("fits_small.py"), storage=storage, steps=5, confirm_factor=10)
    budget = TimeBudget(SearchSettings(budget_s=3600, **settings), started=0.0)
    # second probes of b=64 and b=32 (10 steps: 10 s + 5 x 1 s each), then 3 rounds of each (20 steps: 25 s)
    assert budget.decision_reserve(planner, seen, study) == pytest.approx(2 * 15.0 + 2 * 3 * 25.0)
    short = TimeBudget(SearchSettings(budget_s=300, **settings), started=0.0)
    assert short.decision_reserve(planner, seen, study) == pytest.approx(100.0)


@pytest.mark.parametrize(("factor", "rounds", "window"), [(1, 1, 1), (2, 2, 1), (3, 3, 1), (10, 3, 4)])
def test_an_a_b_adds_up_to_the_confirm_factor_with_fewer_rounds_when_it_is_small(factor, rounds, window):
    """--confirm-factor N: the A/B's windows add up to N probes' steps per entrant. A round is a probe's steps
    at least, so a factor of 1 or 2 once still ran 3 rounds (3 probes' steps); it runs N rounds now."""
    from autofit.search._time_budget import TimeBudget

    budget = TimeBudget(SearchSettings(script="train.py", budget_s=600, steps=5, confirm_factor=factor), started=0.0)
    longest = budget._ab_plans([Config(batch_size=8), Config(batch_size=16)], -1)[0]
    assert (longest.rounds, longest.steps) == (rounds, 5 * window)
