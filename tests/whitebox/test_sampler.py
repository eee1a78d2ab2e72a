"""The search's sampler (autofit.search._sampler) carries the planner's decisions into Optuna's trials."""

from __future__ import annotations

import optuna

from autofit.findings import observations


def test_the_planner_decides_every_trial_through_the_sampler():
    """Nothing is forced: the trial Optuna creates gets the sampler's proposal (the planner's pilot,
    then its next config), and a trial asked without a proposal gets the planner's next config too."""
    from autofit.planner import Planner, SearchSpace
    from autofit.probing import ProbeResult
    from autofit.search._sampler import AutofitSampler
    from autofit.study import record_probe, trial_config

    planner = Planner(SearchSpace.build(batch_range=(1, 256), precision=("fp32", "bf16")), 2**30)
    sampler = AutofitSampler(planner)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    proposal = sampler.propose(study, "explore")
    trial = study.ask(sampler.search_space)
    assert sampler.given(trial) == proposal and proposal.phase == "explore"
    assert trial_config(trial) == proposal.config == planner.next([])
    result = ProbeResult(status="ok", config=proposal.config, samples_per_s=100.0, step_time_median_s=0.04,
                         warmup_steps=2, measured_steps=5, wall_s=1.0, peak_bytes=2**28)
    record_probe(study, trial, result, usable_bytes=2**30, phase="explore")
    expected = planner.next(observations(study.get_trials()))
    plain = study.ask(sampler.search_space)  # no proposal: the sampler decides now
    assert expected not in (None, proposal.config)
    assert trial_config(plain) == expected and sampler.given(plain).config == expected
