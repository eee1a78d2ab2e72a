"""The search's clock: how long the next probe, the A/B (the confirmation) or a timeout should be, from the
probes so far and the budget left. Every estimate is from measured wall times, never guessed."""

from __future__ import annotations

import time
from collections.abc import Sequence

import optuna

from autofit.config import Config
from autofit.planner import AB_ROUNDS, ABPlan, Planner
from autofit.search._settings import SearchSettings
from autofit.study import trial_config, trial_result

#: The share of the budget kept back at most for the decision (the close contenders' second probes, the
#: A/B): the search plans its last minutes for choosing well, not for exploring more.
DECISION_SHARE = 1 / 3


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

    def ab_plan(self, study: optuna.Study, entrants: Sequence[Config], since: int = -1) -> ABPlan | None:
        """The longest A/B (the confirmation, see planner/_ab.py) the budget left holds: every entrant for
        AB_ROUNDS rounds whose windows add up to confirm_factor x a probe's steps, shortened first in its
        windows (down to 2 probes' steps in all), then in its rounds (2), then in its entrants (the last
        first); one entrant runs one long round. None when not even the first's shortest run fits."""
        return next((plan for plan in self._ab_plans(entrants, since)
                     if self.ab_estimate(study, plan) <= self.left()), None)

    def ab_estimate(self, study: optuna.Study, plan: ABPlan) -> float:
        """Seconds `plan` should take, from each entrant's last probe."""
        return sum(plan.rounds * self.confirm_estimate(study, c, plan.steps) for c in plan.entrants)

    def _ab_plans(self, entrants: Sequence[Config], since: int) -> list[ABPlan]:
        """Every A/B `ab_plan` considers, longest first."""
        factor, steps, plans = self.s.confirm_factor, self.s.steps, []
        for n in range(len(entrants), 1, -1):
            for rounds in (AB_ROUNDS, 2):
                for window in sorted({max(1, -(-factor // rounds)), max(1, -(-2 // rounds))}, reverse=True):
                    plans.append(ABPlan(tuple(entrants[:n]), rounds, steps * window, since))
        for length in sorted({f for f in (factor, 5, 3, 2) if f <= factor} or {factor}, reverse=True):
            plans.append(ABPlan(tuple(entrants[:1]), 1, steps * length, since))
        return list(dict.fromkeys(plans)) if entrants else []

    def decision_reserve(self, planner: Planner, seen, study: optuna.Study | None = None) -> float:
        """Time kept back for the decision, so that exploring stops early enough: the close contenders'
        second probes and the longest A/B of the configs within the noise of the leader (estimated from
        their probes), at most a third of the budget."""
        if study is None:
            return 0.0
        remeasures = sum(self.confirm_estimate(study, c, 2 * self.s.steps) for c in planner.contenders(seen))
        plans = self._ab_plans(planner.ab_entrants(seen), -1)
        ab = self.ab_estimate(study, plans[0]) if plans else 0.0
        return min(remeasures + ab, DECISION_SHARE * self.s.budget_s)

    def shortest_ab(self, planner: Planner, seen, study: optuna.Study) -> float:
        """Seconds the shortest A/B of every entrant takes: what a close contender's second probe leaves."""
        entrants = planner.ab_entrants(seen)
        plans = [p for p in self._ab_plans(entrants, -1) if len(p.entrants) == len(entrants)]
        return self.ab_estimate(study, plans[-1]) if plans else 0.0

    def probe_timeout(self, seen) -> float:
        """--probe-timeout, else: the first probe max(60 s, a quarter of the budget); later ones 5x
        the confirmation factor x the slowest ok probe; never beyond the budget left (30 s at least)."""
        if self.s.probe_timeout:
            return self.s.probe_timeout
        walls = [o.wall_s for o in seen if o.status == "ok"]
        derived = max(30.0, 5 * max(walls) * self.s.confirm_factor) if walls else max(60.0, 0.25 * self.s.budget_s)
        return min(derived, max(30.0, self.left()))
