"""The memory estimator inside a search: it estimates in slices of time between the probes, and its
answers join the planner as they arrive. They are kept on the study (a resumed search, `autofit
show` and the report read them from there) and turned into the planner's predictions (see
autofit.planner's _prediction.py).

Its process runs at idle priority (autofit.memory._estimate_process) and loads the script while the
workers load theirs. While a probe runs it is stopped (SIGSTOP): even at idle priority, a process
beside a probe on two cores slowed the probe 3-9x (gpt fp32 b=48: 15-49 samples/s beside it, 115-141
alone), and a probe must time the program the user will run. It gets the CPU in slices instead: once
the space is known (3% of the budget at most) and before each proposal until it is done (one answer,
a few seconds at most), never more than 6% of the budget in all. Whatever it estimated before the
search ended, or it crashed, is used and kept; a search without estimates goes on as before, learning
memory from its probes. `EstimatorLifecycle` is that life, start to end, in one place.
"""

from __future__ import annotations

import threading
import time

import optuna

from autofit.config import Config
from autofit.memory import Estimator
from autofit.planner import MemoryPrediction, SearchSpace, configs_to_estimate, estimated_key
from autofit.search._progress import Reporter
from autofit.search._settings import SearchSettings
from autofit.study import ESTIMATES_ATTR, StoredEstimates, stored_estimates

#: Once the space is known the search may give the estimator this share of its budget for its first
#: answers, and never more than `_MAX_FIRST_S`.
_FIRST_SHARE, _MAX_FIRST_S = 0.03, 30.0
#: Before each later proposal, until its next answer and at most this long...
_SLICE_S = 5.0
#: ... and all its slices together at most this share of the budget.
_TOTAL_SHARE = 0.06
#: Why estimates are missing when the search ended before the estimator (a resumed search asks on).
ENDED_FIRST = "the search ended first"
#: One config's estimate that takes longer than this has hung.
_CONFIG_TIMEOUT_S = 600.0


class EstimatorLifecycle:
    """The memory estimator through one search: it starts with the workers and loads the script while
    they load theirs (`start`), and stops while the probes run (`pause`); once the search space is known
    it estimates in slices of time the search gives it (`ask`, then `update` before each proposal, which
    also hands the new answers to the planner); the answers are kept on the study when it is done or the
    search ends (`close`). A study that kept its estimates needs no estimator."""

    def __init__(self, settings: SearchSettings, script: str, reporter: Reporter, notes: list[str]) -> None:
        self.s = settings
        self.script = script
        self.reporter = reporter
        self.wanted = settings.estimate and settings.world_size == 1  # ranks' sharded memory: not estimated yet
        self.notes = notes
        """The search's notes, where a failed estimator says why its estimates are missing or partial."""
        self._estimator: Estimator | None = None
        self._estimation: _Estimation | None = None
        self._device_type = "cpu"
        self._seen = -1
        self._allowance = 0.0  # seconds of slices left
        self.probes_running = 0
        """Probes of this search running now (several runners): the estimator gets no time then."""

    def start(self, study: optuna.Study) -> None:
        if self.wanted and _kept(study) is None:
            self._estimator = Estimator(self.script, self.s.function)

    def ask(self, study: optuna.Study, space: SearchSpace, limit_bytes: float, device_type: str,
            budget_s: float) -> MemoryPrediction | None:
        """Start estimating `space` between the probes, or read the estimates the study kept; the
        prediction from what is known after a short wait (a few percent of the budget)."""
        if not self.wanted:
            return None
        self._device_type = device_type
        stored = _kept(study)
        if stored is not None:
            return stored.prediction(device_type)
        if self._estimation is not None:
            return self.update(study)
        if self._estimator is None:  # resumed from a study written without estimates
            self._estimator = Estimator(self.script, self.s.function)
        self.reporter.note("memory estimator: estimating between the probes (fake tensors, no memory spent)")
        self._allowance = _TOTAL_SHARE * budget_s
        self._estimation = _Estimation(self._estimator, space, limit_bytes)
        self._estimation.start()
        self._give_time(min(_MAX_FIRST_S, _FIRST_SHARE * budget_s), first_answers=True)
        return self._read(study)

    def update(self, study: optuna.Study) -> MemoryPrediction | None:
        """Before a proposal: a slice of time for the estimator (until its next answer, a few seconds
        at most, within its share of the budget), then the prediction with every answer so far when
        one arrived since the last call (else None). Once the estimator is done, its answers are kept
        on the study and its process stopped."""
        if self._estimation is None:
            return None
        self._give_time(_SLICE_S)
        return self._read(study)

    def pause(self) -> None:
        """A probe starts: nothing of the estimator may run beside it."""
        if self._estimator is not None:
            self._estimator.pause()

    def _give_time(self, limit_s: float, *, first_answers: bool = False) -> None:
        """Let the estimator run until its next answer (`first_answers`: until it is done) or `limit_s`,
        within what is left of its share of the budget; stopped again after."""
        estimation = self._estimation
        wait = min(limit_s, self._allowance)
        if estimation is None or estimation.finished.is_set() or wait <= 0 or self.probes_running:
            return
        started = time.monotonic()
        self._estimator.resume()
        try:
            if first_answers:
                estimation.finished.wait(wait)
            else:
                estimation.answered.clear()
                estimation.answered.wait(wait)
        finally:
            self._estimator.pause()
            self._allowance -= time.monotonic() - started

    def _read(self, study: optuna.Study) -> MemoryPrediction | None:
        stored = self._estimation.snapshot()
        done = self._estimation.finished.is_set()
        if len(stored.breakdowns) == self._seen and not done:
            return None
        self._seen = len(stored.breakdowns)
        if done:
            self._keep(study, stored)
        return stored.prediction(self._device_type)

    def close(self, study: optuna.Study | None = None) -> None:
        """Stop the estimator; what it answered so far is kept on `study`."""
        estimation, self._estimation = self._estimation, None
        if estimation is not None:
            estimation.stop()
            if study is not None:
                self._keep(study, estimation.snapshot())
        if self._estimator is not None:
            self._estimator.close()
            self._estimator = None

    def _keep(self, study: optuna.Study, stored: StoredEstimates) -> None:
        self._estimation = None
        study.set_user_attr(ESTIMATES_ATTR, stored.to_dict())
        self.reporter.note(stored.summary())
        if stored.error or stored.note:
            self.notes.append(stored.summary())
        self.close()  # its work is done: its memory goes back


class _Estimation(threading.Thread):
    """The configs the planner interpolates from, estimated one by one in a thread of the search. A curve stops where its tensors alone, extrapolated from
    its last two estimates, would pass the memory limit: estimating what cannot fit costs the most
    (the largest batches) and tells the planner nothing."""

    def __init__(self, estimator: Estimator, space: SearchSpace, limit_bytes: float) -> None:
        super().__init__(name="autofit-estimation", daemon=True)
        self.estimator = estimator
        self.limit_bytes = limit_bytes
        self.curves: dict[tuple, list[Config]] = {}
        for config in configs_to_estimate(space.configs()):
            self.curves.setdefault(estimated_key(config), []).append(config)
        self.finished = threading.Event()
        self.answered = threading.Event()
        """Set at each answer (the search gives the estimator time until its next one)."""
        self._lock = threading.Lock()
        self._stopped = False
        self._began = time.monotonic()
        self._breakdowns: dict[Config, dict[str, int]] = {}
        self._known: dict[Config, int] = {}  # partial estimates: the parts the optimizers hold
        self._notes: list[str] = []
        self._error: str | None = None
        self._asked = 0
        self._baseline: int | None = None
        self._context: int | None = None

    def run(self) -> None:
        """The curves without checkpointing first, each to its end, smallest batches of each first (two
        estimates predict a whole curve, and the planner explores those curves first); then the
        checkpointed ones likewise."""
        eager = [c for key, c in self.curves.items() if not key[2]]
        checkpointed = [c for key, c in self.curves.items() if key[2]]
        try:
            for curves in (eager, checkpointed):
                for i in range(max((len(c) for c in curves), default=0)):
                    for curve in curves:
                        if i < len(curve) and self._may_fit(curve[i], curve[:i]):
                            self._estimate(curve[i])
                        if self._error is not None or self._stopped:
                            return
        finally:
            self.finished.set()
            self.answered.set()

    def _estimate(self, config: Config) -> None:
        found = self.estimator.estimate([config], timeout=_CONFIG_TIMEOUT_S)
        with self._lock:
            if self._stopped:
                return
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
        return device + t2 + slope * (config.batch_size - b2) <= self.limit_bytes

    def stop(self) -> None:
        """The search ended: the estimator's process is stopped and what it answered stays."""
        with self._lock:
            self._stopped = True
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


def _kept(study: optuna.Study) -> StoredEstimates | None:
    """The estimates the study kept, unless a search ended before its estimator (those are asked on)."""
    stored = stored_estimates(study)
    return None if stored is None or stored.error == ENDED_FIRST else stored


def _first_reason(unavailable: dict) -> str | None:
    """Why some configs had no estimate (a data ceiling is not the estimator's failure)."""
    reasons = [why for why in unavailable.values() if "DataTooSmall" not in why]
    return reasons[0] if reasons else None
