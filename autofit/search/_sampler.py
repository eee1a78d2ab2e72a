"""AutofitSampler: the planner behind Optuna's sampler interface, so that every trial's params are the
planner's decision and the study, the dashboard, resumed searches and parallel workers share one set of
trials and one decision rule.

How a trial gets its config: `AutofitSampler.sample_relative` returns it. Optuna creates a trial before
it asks its sampler, and the search must know whether anything is worth a trial (and whether the budget
allows its length) before one exists; so the search first asks the sampler what the next trial of a
phase would probe (`propose`: a suspect measurement to recheck or the planner's next config while
exploring, then the close contenders, then the A/B's rounds that confirm the winner), and then
`study.ask()`, which asks the sampler, whose `sample_relative` gives that proposal to the new trial. A
trial asked without a proposal (a plain `study.ask()` or `study.optimize`) gets the planner's next config, decided then.

Why not `study.enqueue_trial`: an enqueued trial waits in the study for the next `ask` of anyone, and
several searchers may share one study (`--storage` on PostgreSQL or a journal file): another searcher
would pop this one's choice and probe it as its own, and a search interrupted between the two calls
would leave a waiting trial behind. A sampler's decision reaches only the trial its own search asked
for; two searchers that decide the same config at once are told apart by the claim on the trials
(`Session.ask`: the lower trial number keeps it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial

from autofit.config import Config
from autofit.findings import observations
from autofit.planner import ABPlan, Observation, Planner, SearchSpace
from autofit.probing import RecordedVersion
from autofit.study import config_params, distributions, script_trials

#: The phases whose trials the sampler proposes, in the order a search runs them.
PHASES = ("explore", "remeasure", "confirm")


@dataclass(frozen=True)
class Proposal:
    """What one trial probes, and why."""

    config: Config
    phase: str
    """explore, recheck (a suspect measurement probed again), remeasure or confirm."""


class AutofitSampler(BaseSampler):
    """Gives each trial the planner's decision for the search's current phase (see the module's
    docstring); the trial's params are that config's."""

    def __init__(self, planner: Planner, seed: int | None = None, version: RecordedVersion | None = None) -> None:
        self.planner = planner
        self.version = version
        """The script the search runs (its code and local modules'): only its probes decide (None: the study's,
        see `script_trials`)."""
        self._proposed: Proposal | None = None
        self._given: dict[int, Proposal | None] = {}
        self._fallback = RandomSampler(seed=seed)

    @property
    def search_space(self) -> dict[str, BaseDistribution]:
        """The trial params of the planner's space (it narrows once the first probe names the knobs)."""
        return space_distributions(self.planner.space)

    def propose(self, study: optuna.Study, phase: str, plan: ABPlan | None = None) -> Proposal | None:
        """What the next trial of `phase` would probe, decided now from the study's trials; the next
        trial asked gets it. None: nothing in this phase is worth a probe. `plan`: the A/B a confirm
        phase runs (its next round)."""
        self._proposed = self._decide(observations(script_trials(study, self.version)), phase, plan)
        return self._proposed

    def given(self, trial: optuna.Trial | FrozenTrial) -> Proposal | None:
        """The proposal a trial was given (its config is the trial's params). Optuna asks the sampler
        only when some param has a choice: a trial whose every param has one value takes the
        proposal it would have been given."""
        if trial.number not in self._given:
            self._given[trial.number], self._proposed = self._proposed, None
        return self._given.pop(trial.number)

    def _decide(self, seen: list[Observation], phase: str, plan: ABPlan | None = None) -> Proposal | None:
        if phase == "explore":
            suspect = self.planner.recheck(seen)  # a measurement to trust only once measured again
            if suspect is not None:
                return Proposal(suspect, "recheck")
            config = self.planner.next(seen)
            return Proposal(config, "explore") if config is not None else None
        if phase == "remeasure":
            contenders = self.planner.contenders(seen)
            return Proposal(contenders[0], "remeasure") if contenders else None
        if phase == "confirm":
            config = self.planner.to_confirm(seen, plan)
            return Proposal(config, "confirm") if config is not None else None
        raise ValueError(f"The phase must be one of {', '.join(PHASES)}, but got {phase!r}.")

    # --- Optuna's sampler interface -----------------------------------------------------------
    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.search_space

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        proposal, self._proposed = self._proposed, None
        if proposal is None:  # asked without a proposal: the planner's next config, decided now
            proposal = self._decide(observations(script_trials(study, self.version), exclude=trial.number),
                                    "explore")
        self._given[trial.number] = proposal
        return config_params(proposal.config) if proposal is not None else {}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)


def space_distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """The trial params that hold the configs of `space`."""
    return distributions(**space.distribution_args())
