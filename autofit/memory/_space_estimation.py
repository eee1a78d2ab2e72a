"""The configs of one search space estimated one by one, in a thread of the searching process: the
curves the planner interpolates from, each stopped where its tensors alone would pass the memory
limit. Each config's program is traced once by the estimator's process and the rest of it is arithmetic
(autofit.memory._traced_space). The search gives it time in slices between its probes (autofit.search's
EstimatorLifecycle); what it answered so far is a StoredEstimates at any moment (`snapshot`)."""

from __future__ import annotations

import threading
import time

from autofit.config import Config
from autofit.memory._estimator import Estimator
from autofit.memory._stored_estimates import StoredEstimates
from autofit.planner import SearchSpace, configs_to_estimate, estimated_key

#: Why estimates are missing when the search ended before the estimator (a resumed search asks on).
ENDED_FIRST = "the search ended first"
#: One config's estimate that takes longer than this has hung.
_CONFIG_TIMEOUT_S = 600.0


class SpaceEstimation(threading.Thread):
    """The configs the planner interpolates from, estimated one by one in a thread of the search. A
    curve stops where its tensors alone, extrapolated from its last two estimates, would pass the memory
    limit: estimating what cannot fit costs the most (the largest batches) and tells the planner nothing."""

    def __init__(self, estimator: Estimator, space: SearchSpace, memory_limit: float,
                 first: Config | None = None, previous: SpaceEstimation | None = None) -> None:
        """`first`: a config of the strategy to estimate first (the pilot's): its curve, the line through its
        two smallest batches first, comes before any other strategy. `previous`: the estimation of the space
        the search assumed before it knew this one (retired: it asks nothing more); its answers are this one's,
        and this one asks the estimator once it has stopped."""
        super().__init__(name="autofit-estimation", daemon=True)
        self.estimator = estimator
        self.space = space
        self.memory_limit = memory_limit
        self.curves: dict[tuple, list[Config]] = {}
        for config in configs_to_estimate(space.configs()):
            self.curves.setdefault(estimated_key(config), []).append(config)
        self.first_curve = list(self.curves.get(estimated_key(first), [])) if first is not None else []
        self.finished = threading.Event()
        self.curve = threading.Event()
        """Set once the first strategy's curve is estimated, as far as it may fit (or the estimation ended)."""
        self.answered = threading.Event()
        """Set at each answer (the search gives the estimator time until its next one)."""
        self._lock = threading.Lock()
        self._stopped = False
        self._ended = False
        self._previous = previous
        self._began = previous._began if previous is not None else time.monotonic()
        self._breakdowns: dict[Config, dict[str, int]] = {}
        self._known: dict[Config, int] = {}  # partial estimates: the parts the optimizers hold
        self._notes: list[str] = []
        self._error: str | None = None
        self._asked = 0
        self._baseline: int | None = None
        self._context: int | None = None
        self._answered: set[Config] = set()

    def run(self) -> None:
        """The first strategy's curve (the pilot's, which the planner climbs first; its line, two smallest
        batches, first); then the curves without checkpointing, each to its end, smallest batches of each first
        (two estimates predict a whole curve, and the planner explores those curves first); then the
        checkpointed ones likewise. Each config's program is traced once in the estimator's process (the first
        config of a program takes two traces; the rest are arithmetic: autofit.memory._traced_space)."""
        eager = [c for c in self.curves.values() if not c[0].checkpoint_segments]
        checkpointed = [c for c in self.curves.values() if c[0].checkpoint_segments]
        try:
            if self._previous is not None:
                self._previous.join()  # retired: it ends with its answer in progress
                self._take_over(self._previous)
            for i, config in enumerate(self.first_curve):
                if config not in self._answered and self._may_fit(config, self.first_curve[:i]):
                    self._estimate(config)
                if self._error is not None or self._stopped:
                    return
            self.curve.set()
            for curves in (eager, checkpointed):
                for i in range(max((len(c) for c in curves), default=0)):
                    for curve in curves:
                        if i < len(curve) and curve[i] not in self._answered and self._may_fit(curve[i], curve[:i]):
                            self._estimate(curve[i])
                        if self._error is not None or self._stopped:
                            return
        finally:
            self.curve.set()
            self.finished.set()
            self.answered.set()

    def retire(self) -> None:
        """Ask nothing more (the search knows its space now: a new estimation takes this one's answers over);
        the answer in progress ends as it would, the estimator's process left running."""
        with self._lock:
            self._stopped = True

    def _take_over(self, previous: SpaceEstimation) -> None:
        with self._lock, previous._lock:
            self._breakdowns.update(previous._breakdowns)
            self._known.update(previous._known)
            self._notes += [n for n in previous._notes if n not in self._notes]
            self._baseline, self._context = previous._baseline, previous._context
            self._answered |= previous._answered
            self._asked += previous._asked
            if not self._ended:
                self._error = previous._error if previous._error != ENDED_FIRST else None

    def _estimate(self, config: Config) -> None:
        found = self.estimator.estimate([config], timeout=_CONFIG_TIMEOUT_S, traced=True)
        with self._lock:
            if self._ended:
                return  # the search ended, and its estimator with it: this answer is no answer
            self._answered.add(config)
            self._asked += 1
            self._baseline = found.baseline_bytes if found.baseline_bytes is not None else self._baseline
            self._context = found.context_bytes if found.context_bytes is not None else self._context
            self._breakdowns.update({c: dict(e.breakdown) for c, e in found.estimates.items() if e.complete})
            self._known.update({c: e.total_bytes for c, e in found.estimates.items() if not e.complete})
            self._notes += [line for e in found.estimates.values() if (line := e.summary()) and line not in self._notes]
            self._error = found.error or _first_reason(found.unavailable)
        self.answered.set()

    def _may_fit(self, config: Config, smaller: list[Config]) -> bool:
        """Whether `config`'s tensors, extrapolated from its curve's two largest estimates, stay under
        the limit (a curve whose smaller batches found no estimate is not asked further either)."""
        with self._lock:
            known = [(c.batch_size, sum(self._breakdowns[c].values())) for c in smaller if c in self._breakdowns]
            device = (self._baseline or 0) + (self._context or 0)
        if len(known) < len(smaller):
            return False
        if len(known) < 2:
            return True
        (b1, t1), (b2, t2) = known[-2:]
        slope = max(0.0, (t2 - t1) / (b2 - b1))
        return device + t2 + slope * (config.batch_size - b2) <= self.memory_limit

    def stop(self) -> None:
        """The search ended: the estimator's process is stopped and what it answered stays."""
        with self._lock:
            self._stopped = self._ended = True
            if not self.finished.is_set() and self._error is None and self._asked < self._wanted():
                self._error = ENDED_FIRST
        self.estimator.kill()
        self.join(timeout=30)

    def _wanted(self) -> int:
        return sum(len(curve) for curve in self.curves.values())

    def snapshot(self) -> StoredEstimates:
        """What is known so far, as the study keeps it."""
        with self._lock:
            asked = self._wanted() if self._error == ENDED_FIRST else self._asked  # "n of those it would ask"
            return StoredEstimates(dict(self._breakdowns), self._baseline, time.monotonic() - self._began,
                                   self._error, asked, min(self._known.values()) if self._known else None,
                                   self._notes[0] if self._notes else None, self._context)


def _first_reason(unavailable: dict) -> str | None:
    """Why some configs had no estimate (a data ceiling is not the estimator's failure)."""
    reasons = [why for why in unavailable.values() if "DataTooSmall" not in why]
    return reasons[0] if reasons else None
