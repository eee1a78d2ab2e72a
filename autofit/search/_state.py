"""What the phases of a search work on (`SearchState`): its settings, study session, clock, memory
estimator, runners and sampler, and the one way a phase probes a config: ask the study for a trial
(the sampler gives its proposal), probe it on a runner, store it on the trial and report it."""

from __future__ import annotations

import os
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import optuna

from autofit.config import Config
from autofit.options import SearchOptions
from autofit.planner import MemoryPrediction, Planner, SearchSpace
from autofit.probing import ProbeResult, WorkerInfo
from autofit.search._time_budget import TimeBudget
from autofit.search._build_space import available_cores, build_space
from autofit.search._estimator_slices import EstimatorLifecycle
from autofit.search._pool import RunnerPool
from autofit.search._progress import Reporter
from autofit.search._sampler import AutofitSampler, Proposal
from autofit.search._session import Session
from autofit.search._settings import SearchSettings

if TYPE_CHECKING:
    from autofit.search._pool import Runner


@dataclass
class RunningProbe:
    """A probe on its way: its trial, what the sampler proposed for it, and the runner measuring it."""

    trial: optuna.Trial
    proposal: Proposal
    runner: Runner
    future: Future[ProbeResult]


class SearchState:
    """One search's parts, as the phases use them; the loop (`Search`) starts the runners and sets the
    sampler, then runs the phases over this."""

    def __init__(self, settings: SearchSettings, reporter: Reporter) -> None:
        self.s = settings
        self.reporter = reporter
        self.started = time.monotonic()
        self.time_budget = TimeBudget(settings, self.started)
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

    def learn_knobs(self, result: ProbeResult) -> None:
        """The first probe tells which knobs the function offers: the space narrows to them, and the
        memory estimator, which needs the space, is asked. A loop of its own that reads neither
        run.batch_size nor run.global_batch keeps its own batch: the micro-batch is not searched (climbing
        it changed nothing but the samples counted), and the search says so."""
        offers = result.offers
        if self.session.offers() is not None or not (offers.batches or offers.followed):
            return
        if not offers.batches:
            offers = replace(offers, own_batch=result.config.batch_size)  # the space keeps it (build_space)
            self.notes.append(f"the function's loop reads neither run.batch_size nor run.global_batch: its batch is "
                              f"its own, so the micro-batch was not searched, and samples/s counts "
                              f"{result.config.batch_size} a micro-batch (compare its figures with each other only)")
        space = build_space(self.s, self.options, self.info, offers)
        self.session.save_meta(self.info, space, offers)
        self.planner.learn(space=space, prediction=self.prediction(space, first=result.config))

    def prediction(self, space: SearchSpace, first: Config | None = None) -> MemoryPrediction | None:
        """The memory estimator's prediction over `space` (it starts estimating, `first`'s strategy
        first, or the study kept it)."""
        return self.estimator.ask(self.session.study, space, self.session.memory_budget.limit_bytes,
                                  self.session.device_info.type, self.s.budget_s, first=first)

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
        timeout = self.time_budget.probe_limits(self.session.observations(exclude=trial.number), proposal.config)
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
        self.reporter.probe_finished(probe.trial.number, result, self.session.memory_budget.usable_bytes, self.pool.name(probe.runner))
        return result

    def probe(self, runner: Runner, steps: int) -> ProbeResult | None:
        """The sampler's proposal, probed start to finish on `runner` (None when another searcher
        claimed the config first)."""
        probe = self.start_probe(runner, steps)
        return self.finish_probe(probe) if probe is not None else None


def _shared_cores_note(parallel: int) -> str:
    return (f"{parallel} probes at once shared {available_cores()} cores, each with the threads your run gets: they slowed "
            f"each other, so the ranking (and the answer) may be off; --parallel 1 gives the answer to trust "
            f"(benchmarks/parallel.md)")
