"""The search, start to end: open the study (`Session`), start the runners (`RunnerPool`) and the
memory estimator (`EstimatorLifecycle`), hand the planner to Optuna as the study's sampler, then run
the phases over the search's state (`_phases`: explore, remeasure, confirm, export). Every probe is an
Optuna trial whose params the sampler chose; the config it chose goes to the runner as a `Config` and
comes back on the `ProbeResult`."""

from __future__ import annotations

import time

import optuna

from autofit.planner import Planner
from autofit.search._build_space import build_space, search_options
from autofit.search._phases import confirm, explore, export, remeasure
from autofit.search._pool import RunnerPool
from autofit.search._progress import Reporter
from autofit.search._sampler import AutofitSampler
from autofit.search._settings import SearchResult, SearchSettings
from autofit.search._state import SearchState

optuna.logging.set_verbosity(optuna.logging.WARNING)


class Search:
    """One search; `run()` takes it from the study it opens to the best config it exports."""

    def __init__(self, settings: SearchSettings, reporter: Reporter) -> None:
        self.state = SearchState(settings, reporter)

    def run(self) -> SearchResult:
        state = self.state
        study = state.session.open()
        state.notes.extend(state.session.notes)
        try:
            state.pool = RunnerPool(state.s, state.session)
            return self._run(study)
        finally:
            if state.pool is not None:
                state.pool.close()
            state.estimator.close(study)
            state.session.discard_if_unused()  # a search that failed before its first probe made no study

    def _run(self, study: optuna.Study) -> SearchResult:
        state = self.state
        try:
            state.estimator.start(study)  # it loads the script while the runners load theirs
            state.info = state.pool.start()
            self._start_sampler(study)  # it waits for the estimate of the pilot's strategy
        except KeyboardInterrupt:  # Ctrl-C while loading or estimating: nothing probed, nothing to export
            state.pool.stop()
            return self._interrupted_while_loading()
        stopped = "the planner had nothing left worth probing"
        try:
            stopped = explore(state)
            state.planner.learn(space=state.session.stored_space())  # as narrowed by whichever searcher learnt it
            # One runner, alone: the figures a winner is named and exported with are measured
            # without the other runners' probes competing for the machine.
            remeasure(state, state.pool.runners[0])
            confirm(state, state.pool.runners[0])
            partial = False
        except KeyboardInterrupt:
            stopped, partial = "interrupted (Ctrl-C)", True
            state.pool.stop()
            state.session.fail_unfinished()
        except BaseException:
            # autofit's own failure (a bug, a broken pipe to the worker): the finished probes stay,
            # the unfinished ones are FAIL and are probed again when the same command resumes.
            state.pool.stop()
            state.session.fail_unfinished()
            raise
        state.estimator.close(None if partial else study)  # what it answered is kept, and read by the export
        return export(state, stopped, partial)

    def _start_sampler(self, study: optuna.Study) -> None:
        """The space from the loaded script's options and knobs, and the planner over it as the study's
        sampler, with the memory estimates: of the whole space where a resumed study knows it already, else
        of the pilot's strategy, waited for before the pilot (`EstimatorLifecycle.ask`), which is sized from
        them (the space the first probe reports is estimated after it)."""
        state = self.state
        state.options = search_options(state.info, state.s)
        offers = state.session.offers()
        space = build_space(state.s, state.options, state.info, offers)
        state.session.save_meta(state.info, space, offers)
        state.sampler = AutofitSampler(Planner(space, state.session.memory_budget.usable_bytes, check_noise=state.s.recheck),
                                       seed=state.s.seed, version=state.session.version)
        study.sampler = state.sampler
        state.reporter.started(state, space, len(state.session.trials()))
        if offers is not None:  # resumed: the space is known, and so may the estimates be
            state.planner.learn(prediction=state.prediction(space))
        elif not state.session.observations():  # the pilot is sized from the estimate of its strategy
            state.planner.learn(prediction=state.prediction(space, first=space.config(space.strategies()[0],
                                                                                    space.batch_sizes[0])))

    def _interrupted_while_loading(self) -> SearchResult:
        state = self.state
        return SearchResult(best=None, document=None, json_path=None, ranked=[], study_name=state.session.study_name,
                            storage=state.session.storage_label, probes=0, ooms=0, failed=0,
                            elapsed_s=time.monotonic() - state.started, stopped="interrupted (Ctrl-C)", partial=True,
                            usable_bytes=state.session.memory_budget.usable_bytes, notes=state.notes)
