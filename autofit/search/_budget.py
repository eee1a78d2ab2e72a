"""The search's clock: how long the next probe, a confirmation run or a timeout should be, from the
probes so far and the budget left. Every estimate is from measured wall times, never guessed."""

from __future__ import annotations

import time

import optuna

from autofit.config import Config
from autofit.planner import Planner
from autofit.search._settings import SearchSettings
from autofit.study import trial_config, trial_result


class Budget:
    """The time left of one search, and the lengths that fit in it."""

    def __init__(self, settings: SearchSettings, started: float) -> None:
        self.s = settings
        self.deadline = started + settings.budget_s

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def next_probe_estimate(self, seen, config: Config | None = None) -> float:
        """The longest of the last three probes: what the next one may well take. A compiled config
        compiles in its warm-up, which eager probes never paid: for one, the longest compiled probe
        so far (its compilation included), once there is one."""
        done = [o for o in seen if o.status != "running"]
        if config is not None and config.compile:
            compiled = [o.wall_s for o in done if o.config.compile]
            if compiled:
                return max(compiled)
        walls = [o.wall_s for o in done][-3:]
        return max(walls) if walls else 0.0

    def confirm_estimate(self, study: optuna.Study, config: Config, steps: int) -> float:
        """Seconds a probe of `config` with `steps` measured steps should take, from its last probe."""
        results = [r for t in study.get_trials(deepcopy=False)
                   if trial_config(t) == config and (r := trial_result(t)) and r.ok]
        if not results:
            return 0.0
        last = results[-1]
        # step_time_median_s is per optimizer step, which already holds all accumulation micro-batches.
        extra_steps = max(0, steps - last.measured_steps) * (last.step_time_median_s or 0)
        return last.wall_s + extra_steps

    def confirm_steps(self, study: optuna.Study, config: Config) -> int | None:
        """The confirmation's length: confirm_factor x the probe's steps, shortened to fit the budget
        (at least 2x, or None when not even that fits)."""
        for factor in (self.s.confirm_factor, 5, 3, 2):
            steps = self.s.steps * factor
            if self.confirm_estimate(study, config, steps) <= self.left():
                return steps
        return None

    def confirm_reserve(self, planner: Planner, seen, study: optuna.Study | None = None) -> float:
        """Time kept back for the winner's long run: at most a quarter of the budget."""
        ranked = planner.ranked(seen)
        if not ranked or study is None:
            return 0.0
        estimate = self.confirm_estimate(study, ranked[0].config, self.s.steps * self.s.confirm_factor)
        return min(estimate, 0.25 * self.s.budget_s)

    def probe_timeout(self, seen) -> float:
        """--probe-timeout, else: the first probe max(60 s, a quarter of the budget); later ones 5x
        the confirmation factor x the slowest ok probe; never beyond the budget left (30 s at least)."""
        if self.s.probe_timeout:
            return self.s.probe_timeout
        walls = [o.wall_s for o in seen if o.status == "ok"]
        derived = max(30.0, 5 * max(walls) * self.s.confirm_factor) if walls else max(60.0, 0.25 * self.s.budget_s)
        return min(derived, max(30.0, self.left()))
