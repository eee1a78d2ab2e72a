"""The memory estimator inside a search: it estimates in slices of time between the probes, and its
answers join the planner as they arrive. They are kept on the study (a resumed search, `autofit
show` and the report read them from there) and turned into the planner's predictions (autofit.memory's
StoredEstimates).

Its process loads the script at idle priority (autofit.memory._estimate_process) while the workers
load theirs. While a probe runs it is stopped (SIGSTOP): even at idle priority, a process beside a probe
on two cores slowed the probe 3-9x (gpt fp32 b=48: 15-49 samples/s beside it, 115-141 alone), and a
probe must time the program the user will run. It gets the CPU in slices instead, at normal priority (at
idle priority a slice went to whatever else was runnable): once the space is known, until the first
probe's strategy has its line (two micro-batches; 3% of the budget at most), then before each proposal
until its next answer (a few seconds at most), never more than 6% of the budget in all. Whatever it
estimated before the search ended, or it crashed, is used and kept; a search without estimates goes on
as before, learning memory from its probes. `EstimatorLifecycle` is that life, start to end, in one place.

On an accelerator with cores to spare it runs beside the probes instead, at idle priority, from the
moment the space is known: a GPU probe keeps one or two cores busy, and slices between probes left the
estimator without a single answer in a 2m30s search of GPT-2 small on an H100 (benchmarks/gpu.md,
2026-11-25), so two probes that an estimate would have skipped ran out of memory.
"""

from __future__ import annotations

import time

import optuna

from autofit.config import Config
from autofit.memory import ENDED_FIRST, Estimator, SpaceEstimation, StoredEstimates, stored_estimates
from autofit.planner import MemoryPrediction, SearchSpace
from autofit.search._build_space import available_cores
from autofit.search._progress import Reporter
from autofit.search._settings import SearchSettings
from autofit.study import keep_estimates

#: Before the pilot the search may give the estimator this share of its budget for its first answers (the
#: pilot's strategy: two traces of its program), and never more than `_MAX_FIRST_S`...
_FIRST_SHARE, _MAX_FIRST_S = 0.03, 30.0
#: ... and where it runs beside the probes (an accelerator, whose pilot is sized from its answer), this share,
#: at most `_MAX_PILOT_S`: the traces of GPT-2 medium take 12 s on a 2-core CPU, a probe that runs out of memory
#: on an H200 about 10 s (the features step's memory search spent 3 of its 8 probes so).
_PILOT_SHARE, _MAX_PILOT_S = 0.15, 60.0
#: Before each later proposal, until its next answer and at most this long...
_SLICE_S = 5.0
#: ... and all its slices together at most this share of the budget.
_TOTAL_SHARE = 0.06
#: Beside the probes only on an accelerator, and only with this many cores or more: the probe's
#: Python thread, a loader worker or two, and the estimator each get one with room left.
_CORES_BESIDE = 8


def runs_beside_probes(device_type: str, cores: int) -> bool:
    """Whether the estimator may run while a probe is timed: never on the CPU, whose probes use every
    core; on an accelerator when the machine has cores to spare."""
    return device_type != "cpu" and cores >= _CORES_BESIDE


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
        self._estimation: SpaceEstimation | None = None
        self._device_type = "cpu"
        self._seen = -1
        self._allowance = 0.0  # seconds of slices left
        self.probes_running = 0
        """Probes of this search running now (several runners): the estimator gets no time then."""
        self.beside = False
        """It runs beside the probes (an accelerator with cores to spare), not in slices between them."""

    def start(self, study: optuna.Study) -> None:
        if self.wanted and _kept(study) is None:
            self._estimator = self._start_estimator()

    def _start_estimator(self) -> Estimator:
        """Its process, counting the kernels of the search's device; at normal priority once loaded where
        it gets slices between the probes (at idle priority a slice went to whatever else was runnable)."""
        return Estimator(self.script, self.s.function, target=_target(self.s.device),
                         beside_probes=runs_beside_probes(self.s.device, available_cores()))

    def ask(self, study: optuna.Study, space: SearchSpace, memory_limit: float, device_type: str,
            budget_s: float, first: Config | None = None) -> MemoryPrediction | None:
        """Start estimating `space`, `first`'s strategy (the pilot's) first, or read the estimates the study
        kept; the prediction from what is known after a short wait: until that strategy's curve is estimated
        (two traces of its program, the rest arithmetic), a few percent of the budget at most between the
        probes, and on an accelerator, where it runs beside them, `_PILOT_SHARE` of it (the pilot is sized
        from it). Asked again with another space (the function's knobs, known after the first probe), the
        estimation goes on over that one, with every answer so far."""
        if not self.wanted:
            return None
        self._device_type = device_type
        stored = _kept(study)
        if stored is not None:
            return stored.prediction(device_type)
        if self._estimation is not None:
            if self._estimation.space == space:
                return self.update(study)
            self._estimation.retire()  # the space it estimated was assumed before the first probe
            self._estimation = SpaceEstimation(self._estimator, space, memory_limit, first, self._estimation)
            self._estimation.start()
            return self.update(study)
        if self._estimator is None:  # resumed from a study written without estimates
            self._estimator = self._start_estimator()
        self.beside = runs_beside_probes(device_type, available_cores())
        where = "beside the probes, at idle priority" if self.beside else "between the probes"
        self.reporter.note(f"memory estimator: estimating {where} (fake tensors, no memory spent)")
        self._allowance = _TOTAL_SHARE * budget_s
        self._estimation = SpaceEstimation(self._estimator, space, memory_limit, first)
        self._estimation.start()
        if self.beside:
            self._estimator.resume()  # and never stopped again: the probes leave it cores
            self._estimation.curve.wait(min(_MAX_PILOT_S, _PILOT_SHARE * budget_s))
            return self._read(study)
        self._give_time(min(_MAX_FIRST_S, _FIRST_SHARE * budget_s), first_curve=True)
        return self._read(study)

    def update(self, study: optuna.Study) -> MemoryPrediction | None:
        """Before a proposal: a slice of time for the estimator (until its next answer, a few seconds
        at most, within its share of the budget), then the prediction with every answer so far when
        one arrived since the last call (else None). Once the estimator is done, its answers are kept
        on the study and its process stopped."""
        if self._estimation is None:
            return None
        if not self.beside:
            self._give_time(_SLICE_S)
        return self._read(study)

    def pause(self) -> None:
        """A probe starts: nothing of the estimator may run beside it, unless it runs `beside` them."""
        if self._estimator is not None and not self.beside:
            self._estimator.pause()

    def _give_time(self, limit_s: float, *, first_curve: bool = False) -> None:
        """Let the estimator run until its next answer (`first_curve`: until the first strategy's curve) or
        `limit_s`, within what is left of its share of the budget; stopped again after."""
        estimation = self._estimation
        wait = min(limit_s, self._allowance)
        if estimation is None or estimation.finished.is_set() or wait <= 0 or self.probes_running:
            return
        started = time.monotonic()
        self._estimator.resume()
        try:
            if first_curve:
                estimation.curve.wait(wait)
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
        keep_estimates(study, stored.to_dict())
        self.reporter.note(stored.summary())
        if stored.error or stored.note:
            self.notes.append(stored.summary())
        self.close()  # its work is done: its memory goes back


def _target(device: str) -> str:
    """The device type whose kernels the estimates count: CUDA's on a GPU (estimated on the CPU)."""
    return "cuda" if device == "cuda" else "cpu"


def _kept(study: optuna.Study) -> StoredEstimates | None:
    """The estimates the study kept, unless a search ended before its estimator (those are asked on)."""
    stored = stored_estimates(study)
    return None if stored is None or stored.error == ENDED_FIRST else stored
