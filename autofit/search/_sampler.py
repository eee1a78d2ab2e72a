"""AutofitSampler: Optuna's sampler interface around the planner, so the study, the dashboard and
parallel workers share one set of trials and one decision rule."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial

from autofit.config import Config
from autofit.planner import Planner
from autofit.study import config_params, observations


class AutofitSampler(BaseSampler):
    """Samples the planner's next config; `force` pins the next trial (re-measurements)."""

    def __init__(self, planner: Planner, search_space: dict[str, BaseDistribution], seed: int | None = None) -> None:
        self.planner = planner
        self.search_space = search_space
        self._forced: Config | None = None
        self._fallback = RandomSampler(seed=seed)

    def force(self, config: Config | None) -> None:
        self._forced = config

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.search_space)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if self._forced is not None:
            config, self._forced = self._forced, None
            return config_params(config)
        seen = observations(study.get_trials(deepcopy=False), exclude=trial.number)
        config = self.planner.next(seen)
        return config_params(config) if config is not None else {}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)
