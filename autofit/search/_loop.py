"""The search, start to end: open the study (`Session`), start the runners (`RunnerPool`) and the
memory estimator (`EstimatorLifecycle`), hand the planner to Optuna as the study's sampler, then run
the phases (`_phases`: explore, remeasure, confirm, export). Every probe is an Optuna trial whose
params the sampler chose; the config it chose goes to the runner as a `Config` and comes back on the
`ProbeResult`."""

from __future__ import annotations

import os
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

import optuna

from autofit.options import SearchOptions
from autofit.planner import MemoryPrediction, Planner, SearchSpace
from autofit.probing import ProbeResult, WorkerInfo
from autofit.search._budget import Budget
from autofit.search._build_space import available_cores, build_space, search_options
from autofit.search._estimates import EstimatorLifecycle
from autofit.search._phases import confirm, explore, export, remeasure
from autofit.search._pool import RunnerPool
from autofit.search._progress import Reporter
from autofit.search._sampler import AutofitSampler, Proposal
from autofit.search._session import Session
from autofit.search._settings import SearchResult, SearchSettings

if TYPE_CHECKING:
    from autofit.search._pool import Runner

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass
class RunningProbe:
    """A probe on its way: its trial, what the sampler proposed for it, and the runner measuring it."""

    trial: optuna.Trial
    proposal: Proposal
    runner: Runner
    future: Future[ProbeResult]


class Search:
    """One search; `run()` takes it from the study it opens to the best config it exports."""

    def __init__(self, settings: SearchSettings, reporter: Reporter) -> None:
        self.s = settings
        self.reporter = reporter
        self.started = time.monotonic()
        self.budget = Budget(settings, self.started)
        self.session = Session(settings)
        self.notes: list[str] = []
        """What the search says beside its answer (SearchResult.notes)."""
        if settings.device == "cpu" and len(self.session.slots) > 1:
            self.notes.append(_shared_cores_note(len(self.session.slots)))
        self.estimator = EstimatorLifecycle(settings, self.session.script, reporter, self.notes)
        self.probes_this_run = 0
        self.pool: RunnerPool | None = None
        self.sampler: AutofitSampler | None = None
        self.info: WorkerInfo | None = None
        """What the first runner reported once it loaded the script."""
        self.options: SearchOptions | None = None
        """The decorator's options with the settings on top."""

    @property
    def planner(self) -> Planner:
        """The planner behind the sampler: every phase ranks with it."""
        return self.sampler.planner

    def run(self) -> SearchResult:
        study = self.session.open()
        self.notes.extend(self.session.notes)
        try:
            self.pool = RunnerPool(self.s, self.session)
            return self._run(study)
        finally:
            if self.pool is not None:
                self.pool.close()
            self.estimator.close(study)
            self.session.discard_if_unused()  # a search that failed before its first probe made no study

    def _run(self, study: optuna.Study) -> SearchResult:
        try:
            self.estimator.start(study)  # it loads the script while the runners load theirs
            self.info = self.pool.start()
        except KeyboardInterrupt:  # Ctrl-C while loading: nothing probed, nothing to export
            self.pool.stop()
            return self._interrupted_while_loading()
        self.options = search_options(self.info, self.s)
        knobs = self.session.knobs()
        space = build_space(self.s, self.options, self.info, knobs)
        self.session.save_meta(self.info, space, knobs)
        self.sampler = AutofitSampler(Planner(space, self.session.usable, check_noise=self.s.recheck),
                                      seed=self.s.seed)
        study.sampler = self.sampler
        self.reporter.started(self, space, len(study.trials))
        if knobs is not None:  # resumed: the space is known, and so may the estimates be
            self.planner.learn(prediction=self._prediction(space))
        stopped = "the planner had nothing left worth probing"
        try:
            stopped = explore(self)
            self.planner.learn(space=self.session.stored_space())  # as narrowed by whichever searcher learnt it
            # One runner, alone: the figures a winner is named and exported with are measured
            # without the other runners' probes competing for the machine.
            remeasure(self, self.pool.runners[0])
            confirm(self, self.pool.runners[0])
            partial = False
        except KeyboardInterrupt:
            stopped, partial = "interrupted (Ctrl-C)", True
            self.pool.stop()
            self.session.fail_unfinished()
        except BaseException:
            # autofit's own failure (a bug, a broken pipe to the worker): the finished probes stay,
            # the unfinished ones are FAIL and are probed again when the same command resumes.
            self.pool.stop()
            self.session.fail_unfinished()
            raise
        self.estimator.close(None if partial else study)  # what it answered is kept, and read by the export
        return export(self, stopped, partial)

    def _interrupted_while_loading(self) -> SearchResult:
        return SearchResult(best=None, document=None, json_path=None, ranked=[], study_name=self.session.study_name,
                            storage=self.session.storage_label, probes=0, ooms=0, failed=0,
                            elapsed_s=time.monotonic() - self.started, stopped="interrupted (Ctrl-C)", partial=True,
                            usable_bytes=self.session.usable, notes=self.notes)

    # --- what the phases call -----------------------------------------------------------------
    def learn_knobs(self, result: ProbeResult) -> None:
        """The first probe tells which knobs the function offers: the space narrows to them, and the
        memory estimator, which needs the space, is asked."""
        if self.session.knobs() is None and result.knobs.get("batches"):
            space = build_space(self.s, self.options, self.info, result.knobs)
            self.session.save_meta(self.info, space, result.knobs)
            self.planner.learn(space=space, prediction=self._prediction(space))

    def _prediction(self, space: SearchSpace) -> MemoryPrediction | None:
        return self.estimator.ask(self.session.study, space, self.session.memory_limit,
                                  self.session.device_info.type, self.s.budget_s)

    def start_probe(self, runner: Runner, steps: int) -> RunningProbe | None:
        """Ask the study for a trial (in this thread), which the sampler gives its proposal, and probe
        that config in the runner's own thread. None when another searcher claimed the config first."""
        self.planner.learn(prediction=self.estimator.update(self.session.study))  # a slice, then its answers
        asked = self.session.ask(self.sampler, f"{runner.device}:{runner.index}")
        if asked is None:
            return None
        trial, proposal = asked
        self.reporter.probe_started(trial.number, proposal.config, proposal.phase)
        log_path = os.path.join(self.session.run_dir, f"trial-{trial.number}.log")
        os.makedirs(self.session.run_dir, exist_ok=True)
        timeout = self.budget.probe_timeout(self.session.observations(exclude=trial.number))
        self.estimator.pause()  # nothing of it runs beside a timed probe
        self.estimator.probes_running += 1
        future = self.pool.probe(runner, proposal.config, steps=steps, timeout=timeout, log_path=log_path,
                                 trial_id=trial._trial_id, heartbeat=self.session.heartbeat(trial))
        return RunningProbe(trial, proposal, runner, future)

    def finish_probe(self, probe: RunningProbe) -> ProbeResult:
        """Wait for the probe, store it on its trial and report it."""
        try:
            result = probe.future.result()
        finally:
            self.estimator.probes_running -= 1
        self.session.record(probe.trial, result, probe.proposal.phase)
        self.probes_this_run += 1
        self.reporter.probe_finished(probe.trial.number, result, self.session.usable, self.pool.name(probe.runner))
        return result

    def probe(self, runner: Runner, steps: int) -> ProbeResult | None:
        """The sampler's proposal, probed start to finish on `runner` (None when another searcher
        claimed the config first)."""
        probe = self.start_probe(runner, steps)
        return self.finish_probe(probe) if probe is not None else None


def _shared_cores_note(workers: int) -> str:
    return (f"{workers} workers shared {available_cores()} cores, each probe with the threads your run gets: their probes slowed "
            f"each other, so the ranking (and the answer) may be off; one worker gives the answer to trust "
            f"(benchmarks/parallel.md)")
