"""The search's clock: how long the next probe, the A/B (the confirmation) or a timeout should be, from the
probes so far and the budget left. Every estimate is from measured wall times, never guessed."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import optuna

from autofit.config import KNOBS, Config
from autofit.planner import AB_ROUNDS, ABPlan, Planner
from autofit.probing import MIN_MEASURE_S, ProbeLimits
from autofit.search._settings import SearchSettings
from autofit.study import script_trials, trial_config, trial_result

#: The share of the budget kept back at most for the decision (the close contenders' second probes, the
#: A/B): the search plans its last minutes for choosing well, not for exploring more.
DECISION_SHARE = 1 / 3
#: A confirmation of the leader alone (no config within its noise) takes this share of the budget at most.
ONE_ENTRANT_SHARE = 1 / 4


class TimeBudget:
    """The time left of one search, and the lengths that fit in it."""

    def __init__(self, settings: SearchSettings, started: float) -> None:
        self.s = settings
        self.deadline = started + settings.budget_s

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def next_probe_estimate(self, seen, config: Config | None = None, worker_start_s: float = 0.0) -> float:
        """What a probe of `config` should take, priced by what it costs: its start (the longest start
        seen among probes that compile as it does: its set-up, its own evaluation, compilation) and its
        steps (warm-up, the measured window of at least MIN_MEASURE_S, the counted step), each step of the
        micro-batches it runs at the time per sample seen nearest to it. Without a config, or before any
        probe ran a step, the longest of the last three probes' walls. `worker_start_s`: the wait for a
        fresh worker before it begins (its runner's `next_start_s`: a replaced worker's start, which no
        probe's wall holds; on an H100 two probes of 49.1 s and 51.7 s took 129.8 s of the budget)."""
        return worker_start_s + self._probe_estimate(seen, config)

    def _probe_estimate(self, seen, config: Config | None) -> float:
        done = [o for o in seen if o.status != "running"]
        walls = [o.wall_s for o in done][-3:]
        fallback = max(walls) if walls else 0.0
        if config is None:
            return fallback
        per_sample = _per_sample_s(done, config)
        if per_sample is None:
            compiled = [o.wall_s for o in done if o.config.compile == config.compile]
            return max(compiled) if compiled else fallback
        starts = [o.start_s for o in done if o.start_s is not None and o.config.compile == config.compile]
        start = max(starts) if starts else max((o.start_s for o in done if o.start_s is not None), default=0.0)
        step = per_sample * config.size * config.probe_accumulation
        measured = max(MIN_MEASURE_S, config.probe_steps(self.s.steps) * step)
        return start + measured + (self.s.warmup + 1) * step

    def confirm_estimate(self, study: optuna.Study, config: Config, steps: int) -> float:
        """Seconds a probe of `config` with `steps` measured steps should take, from its last probe."""
        results = [r for t in script_trials(study)
                   if trial_config(t) == config and (r := trial_result(t)) and r.ok]
        if not results:
            return 0.0
        last = results[-1]
        # The probe's own step (of the micro-batches it ran: a longer accumulation is priced, not run); a
        # probe's length is asked in micro-batches (`Config.probe_steps`).
        step = last.probe_step_s or last.step_time_median_s or 0
        return last.wall_s + max(0, config.probe_steps(steps) - last.measured_steps) * step

    def ab_plan(self, study: optuna.Study, entrants: Sequence[Config], since: int = -1) -> ABPlan | None:
        """The longest A/B (the confirmation, see planner/_ab.py) the budget left holds: every entrant for
        AB_ROUNDS rounds (as many as confirm_factor when it is smaller) whose windows add up to confirm_factor x
        a probe's steps, shortened first in its
        windows (down to 2 probes' steps in all), then in its rounds (2), then in its entrants (the last
        first); one entrant runs one long round, a quarter of the budget at most (one config measured
        longer is no A/B: it can only correct the leader's own figure). None when not even the first's
        shortest run fits."""
        return next((plan for plan in self._ab_plans(entrants, since)
                     if self.ab_estimate(study, plan) <= self._ab_allowance(plan)), None)

    def _ab_allowance(self, plan: ABPlan) -> float:
        left = self.left()
        return min(left, ONE_ENTRANT_SHARE * self.s.budget_s) if len(plan.entrants) == 1 else left

    def ab_estimate(self, study: optuna.Study, plan: ABPlan) -> float:
        """Seconds `plan` should take, from each entrant's last probe."""
        return sum(plan.rounds * self.confirm_estimate(study, c, plan.steps) for c in plan.entrants)

    def _ab_plans(self, entrants: Sequence[Config], since: int) -> list[ABPlan]:
        """Every A/B `ab_plan` considers, longest first."""
        factor, steps, plans = self.s.confirm_factor, self.s.steps, []
        # A factor below AB_ROUNDS runs fewer rounds (a round is a probe's steps at least): windows that add
        # up to the factor, as --confirm-factor says, not 3 probes' steps whatever it asks for.
        shortest = min(2, factor)
        for n in range(len(entrants), 1, -1):
            for rounds in sorted({min(AB_ROUNDS, factor), shortest}, reverse=True):
                for window in sorted({max(1, -(-factor // rounds)), max(1, -(-shortest // rounds))}, reverse=True):
                    plans.append(ABPlan(tuple(entrants[:n]), rounds, steps * window, since))
        for length in sorted({f for f in (factor, 5, 3, 2) if f <= factor} or {factor}, reverse=True):
            plans.append(ABPlan(tuple(entrants[:1]), 1, steps * length, since))
        return list(dict.fromkeys(plans)) if entrants else []

    def decision_reserve(self, planner: Planner, seen, study: optuna.Study | None = None) -> float:
        """Time kept back for the decision, so that exploring stops early enough: the close contenders'
        second probes and the longest A/B of the configs within the noise of the leader (estimated from
        their probes), at most a third of the budget. A leader with no company whose strategy can still
        climb keeps nothing back: its climb comes before a longer measurement of it."""
        if study is None:
            return 0.0
        remeasures = sum(self.confirm_estimate(study, c, 2 * self.s.steps) for c in planner.contenders(seen))
        entrants = planner.ab_entrants(seen)
        if len(entrants) == 1 and planner.leader_can_climb(seen):
            return min(remeasures, DECISION_SHARE * self.s.budget_s)
        plans = [p for p in self._ab_plans(entrants, -1)
                 if self.ab_estimate(study, p) <= self._ab_allowance(p) or len(p.entrants) > 1]
        ab = self.ab_estimate(study, plans[0]) if plans else 0.0
        return min(remeasures + ab, DECISION_SHARE * self.s.budget_s)

    def shortest_ab(self, planner: Planner, seen, study: optuna.Study) -> float:
        """Seconds the shortest A/B of every entrant takes: what a close contender's second probe leaves."""
        entrants = planner.ab_entrants(seen)
        plans = [p for p in self._ab_plans(entrants, -1) if len(p.entrants) == len(entrants)]
        return self.ab_estimate(study, plans[-1]) if plans else 0.0

    def probe_limits(self, seen, config: Config | None = None) -> ProbeLimits:
        """When a probe is killed (`ProbeLimits`), never past the budget left (`total_s`), however it
        progresses. --probe-timeout limits its start and each stretch of its steps without progress alike.
        Else its start (until its first micro-batch ends: set-up, its own evaluation, compilation) gets
        what the budget left allows for the first probe (nothing is known of it, and a search with nothing
        measured has nothing to export), then 3x the longest start seen (60 s at least); its steps may go
        without progress for 20x the slowest step seen (60 s at least; a quarter of the budget before any).
        A config probed again after it timed out gets all the budget left."""
        left = max(1.0, self.left())
        if self.s.probe_timeout:
            return ProbeLimits(self.s.probe_timeout, self.s.probe_timeout, left)
        done = [o for o in seen if o.status != "running"]
        if config is not None and any(o.config == config and o.timed_out for o in done):
            return ProbeLimits(left, left, left)  # probed again for a timeout: all the budget left allows
        compiles = config.compile if config is not None else None
        starts = [o.start_s for o in done if o.start_s is not None and (compiles is None or o.config.compile == compiles)]
        start = max(60.0, 3 * max(starts)) if starts else left
        steps = [o.step_s for o in done if o.status == "ok" and o.step_s]
        stall = max(60.0, 20 * max(steps)) if steps else max(60.0, 0.25 * self.s.budget_s)
        return ProbeLimits(min(start, left), min(stall, left), left)


def _computes(config: Config) -> tuple:
    """What a config computes, apart from its size and accumulation: its knobs that change memory or speed."""
    return tuple(getattr(config, k.name) for k in KNOBS
                 if k.order in ("memory", "compute") and k.name != "accumulation_steps")


def _per_sample_s(done, config: Config) -> float | None:
    """Seconds per sample (per token cap's token, by tokens) of a probe's step, from the probe nearest to
    `config` that ran its steps and is sized as it is (a token function's pilot by samples prices no token
    cap): the same strategy first, the nearest micro-batch next (per sample, a step costs less at a larger
    one)."""
    by_tokens = config.max_tokens is not None
    measured = [o for o in done if o.status == "ok" and o.step_s and (o.config.max_tokens is not None) == by_tokens]
    if not measured:
        return None

    def distance(o) -> tuple:
        return _computes(o.config) != _computes(config), abs(math.log(o.config.size / config.size))

    nearest = min(measured, key=distance)
    return nearest.step_s / (nearest.config.size * (nearest.ran_accumulation or nearest.config.accumulation_steps))
