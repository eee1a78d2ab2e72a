"""The memory estimator inside a search: asked once, when the search space is known, its answers
kept on the study (a resumed search, `autofit show` and the report read them from there) and turned
into the planner's predictions (see autofit.planner's _prediction.py).

Its process starts with the search and loads the script while the workers load theirs; it answers
while no probe runs (two processes on two cores would time each other), within a share of the
budget. Whatever it estimated before a crash or the time limit is used, and a search without
estimates goes on as before, learning memory from its probes. `EstimatorLifecycle` is that life,
start to end, in one place.
"""

from __future__ import annotations

import time

import optuna

from autofit.config import Config
from autofit.memory import Estimator
from autofit.planner import MemoryPrediction, SearchSpace, configs_to_estimate, estimated_key
from autofit.search._progress import Reporter
from autofit.search._settings import SearchSettings
from autofit.study import ESTIMATES_ATTR, StoredEstimates, stored_estimates

#: The estimator may take this share of the budget, within these bounds in seconds.
_BUDGET_SHARE = 0.15
_MIN_S, _MAX_S = 30.0, 120.0


class EstimatorLifecycle:
    """The memory estimator through one search: it starts with the workers and loads the script while
    they load theirs (`start`); it is ready before the first probe, so as not to slow it (`wait_ready`);
    it is asked once, when the search space is known, and closed as soon as it answered, its memory
    given back (`prediction`). A study that kept its estimates needs no estimator."""

    def __init__(self, settings: SearchSettings, script: str, reporter: Reporter, notes: list[str]) -> None:
        self.s = settings
        self.script = script
        self.reporter = reporter
        self.wanted = settings.estimate and settings.world_size == 1  # ranks' sharded memory: not estimated yet
        self.notes = notes
        """The search's notes, where a failed estimator says why its estimates are missing or partial."""
        self._estimator: Estimator | None = None

    def start(self, study: optuna.Study) -> None:
        if self.wanted and stored_estimates(study) is None:
            self._estimator = Estimator(self.script, self.s.function)

    def wait_ready(self) -> None:
        if self._estimator is not None:
            self._estimator.wait_ready()

    def prediction(self, study: optuna.Study, space: SearchSpace, limit_bytes: float,
                   device_type: str) -> MemoryPrediction | None:
        """The planner's predictions for `space`: from the estimates kept on the study, or asked now (no
        probe runs meanwhile). A failed estimator is reported; the search goes on without it."""
        if not self.wanted:
            return None
        stored = stored_estimates(study)
        if stored is None:
            if self._estimator is None:  # resumed from a study written without estimates
                self._estimator = Estimator(self.script, self.s.function)
            self.reporter.note("asking the memory estimator (fake tensors, no memory spent) ...")
            stored = estimate_space(study, self._estimator, space, self.s.budget_s, limit_bytes)
            self.close()  # its work is done: its memory goes back
            self.reporter.note(stored.summary())
            if stored.error or stored.note:
                self.notes.append(stored.summary())
        return stored.prediction(device_type)

    def close(self) -> None:
        if self._estimator is not None:
            self._estimator.close()
            self._estimator = None


def estimate_space(study: optuna.Study, estimator: Estimator, space: SearchSpace, budget_s: float,
                   limit_bytes: float) -> StoredEstimates:
    """Estimate the configs the planner interpolates from, smallest batches first, and keep the
    answers on the study. A curve stops where its tensors alone, extrapolated from its last two
    estimates, would pass the memory limit: estimating what cannot fit costs the most (the largest
    batches) and tells the planner nothing."""
    configs = configs_to_estimate(space.configs())
    allowed = min(_MAX_S, max(_MIN_S, _BUDGET_SHARE * budget_s))
    deadline = time.monotonic() + allowed
    started = time.monotonic()
    breakdowns: dict[Config, dict[str, int]] = {}
    curves: dict[tuple, list[Config]] = {}
    for config in configs:
        curves.setdefault(estimated_key(config), []).append(config)
    error, baseline, asked = None, None, 0
    known: dict[Config, int] = {}  # partial estimates: the parts the optimizers hold
    notes: list[str] = []
    for i in range(max(len(c) for c in curves.values())):
        wanted = [c[i] for c in curves.values() if i < len(c) and _may_fit(c[i], c[:i], breakdowns,
                                                                             baseline or 0, limit_bytes)]
        if not wanted or error is not None:
            break
        asked += len(wanted)
        found = estimator.estimate(wanted, timeout=max(1.0, deadline - time.monotonic()))
        baseline = found.baseline_bytes if found.baseline_bytes is not None else baseline
        breakdowns.update({c: dict(e.breakdown) for c, e in found.estimates.items() if e.complete})
        known.update({c: e.total_bytes for c, e in found.estimates.items() if not e.complete})
        notes += [line for e in found.estimates.values() if (line := e.summary()) and line not in notes]
        error = error or (f"its {allowed:.0f}s ran out" if estimator.timed_out else found.error) \
            or _first_reason(found.unavailable)
    stored = StoredEstimates(breakdowns, baseline, time.monotonic() - started, error, asked,
                             min(known.values()) if known else None, notes[0] if notes else None)
    study.set_user_attr(ESTIMATES_ATTR, stored.to_dict())
    return stored


def _may_fit(config: Config, smaller: list[Config], breakdowns: dict[Config, dict[str, int]], baseline: float,
             limit: float) -> bool:
    """Whether `config`'s tensors, extrapolated from its curve's two largest estimates, stay under
    the limit (a curve whose smaller batches found no estimate is not asked further either)."""
    known = [(c.batch_size, sum(breakdowns[c].values())) for c in smaller if c in breakdowns]
    if len(known) < len(smaller):
        return False
    if len(known) < 2:
        return True
    (b1, t1), (b2, t2) = known[-2:]
    slope = max(0.0, (t2 - t1) / (b2 - b1))
    return baseline + t2 + slope * (config.batch_size - b2) <= limit


def _first_reason(unavailable: dict) -> str | None:
    """Why some configs had no estimate (a data ceiling is not the estimator's failure)."""
    reasons = [why for why in unavailable.values() if "DataTooSmall" not in why]
    return reasons[0] if reasons else None
