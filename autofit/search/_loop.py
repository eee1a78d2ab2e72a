"""The search's loop: explore with the planner, recheck suspect measurements, re-measure the close
contenders, confirm the winner with a long run, export it. Every probe is an Optuna trial."""

from __future__ import annotations

import os
import time

import optuna

from autofit.config import Config
from autofit.devices import check_device
from autofit.discover import check_script
from autofit.document import best_document, record_end
from autofit.errors import NoFeasibleConfig, UsageError, UserCodeError
from autofit.options import SearchOptions
from autofit.record import ProbeResult
from autofit.results import default_best_path, device_tag, script_sha256, write_best
from autofit.search._budget import Budget
from autofit.search._explain import fault_notes, nothing_fits
from autofit.search._liveness import Heartbeat, owner_record
from autofit.search._planner import Planner
from autofit.search._progress import Reporter
from autofit.search._resume import fail_trials, open_study
from autofit.search._sampler import AutofitSampler
from autofit.search._settings import SearchResult, SearchSettings
from autofit.search._space import SearchSpace
from autofit.storage import default_study_name, open_storage, quiet_heartbeat_warnings, storage_label
from autofit.trials import distributions, observations, record_probe, trial_config
from autofit.worker import Worker

optuna.logging.set_verbosity(optuna.logging.WARNING)


class Search:
    """One search's state; `run()` drives it. Split into steps so each reads on its own."""

    def __init__(self, settings: SearchSettings, reporter: Reporter) -> None:
        self.s = settings
        self.reporter = reporter
        self.started = time.monotonic()
        self.budget = Budget(settings, self.started)
        self.script = check_script(settings.script)
        self.device_info = check_device(settings.device, settings.index)
        self.storage_url = storage_label(settings.storage)
        self.storage = open_storage(settings.storage)  # a bad storage fails before any probe
        self.study_name = settings.study or default_study_name(self.script, settings.function, settings.device, settings.index)
        self.run_dir = os.path.join(os.path.dirname(self._db_dir()), "runs", self.study_name)
        self.limit = settings.memory_limit or self._device_memory()
        self.usable = self.limit * (1 - settings.headroom)
        self.probes_this_run = 0
        self.script_sha256 = script_sha256(self.script)  # the script as these probes measure it
        self.notes: list[str] = []
        self._asked: list[int] = []

    def _db_dir(self) -> str:
        url = self.storage_url
        if url.startswith("sqlite:///"):
            return os.path.abspath(url[len("sqlite:///"):])
        return os.path.abspath(os.path.join("studies", "x"))

    def _device_memory(self) -> int:
        info = self.device_info
        if info.type == "cpu":  # no limit given: cap at what is free now, so the machine survives
            return int(info.free_bytes or info.total_bytes)
        return int(info.total_bytes)

    # --- set-up -------------------------------------------------------------------------------
    def open_study(self) -> optuna.Study:
        opened = open_study(self.storage, self.study_name, fresh=self.s.fresh, device_name=self.device_info.name,
                            limit_bytes=self.limit, limit_given=self.s.memory_limit is not None,
                            headroom=self.s.headroom, script_sha256=self.script_sha256)
        self.limit = opened.limit_bytes
        self.usable = self.limit * (1 - self.s.headroom)
        self.notes.extend(opened.notes)
        return opened.study

    def build_space(self, options: SearchOptions, info, knobs: dict | None) -> SearchSpace:
        precisions = info.precisions
        wanted = options.precision or tuple(info.default_precisions)
        unsupported = [p for p in wanted if p not in precisions]
        if unsupported:
            raise UsageError(f"The precision must be one the device runs ({', '.join(precisions)}), "
                             f"but got {', '.join(unsupported)}.")
        if knobs is not None and not knobs.get("autocast"):
            wanted = wanted[:1]  # the function never enters run.autocast(): precision changes nothing
        blocks = knobs.get("checkpoint_blocks") if knobs else None
        accumulations = options.accumulation
        if knobs is not None and not knobs.get("backward") and accumulations:
            accumulations = (1,)
        return SearchSpace.build(batch_range=options.batch_size, precisions=tuple(wanted),
                                 checkpoint_blocks=blocks, use_checkpoint=options.checkpoint,
                                 global_batch=options.global_batch, accumulations=accumulations)

    # --- the loop -----------------------------------------------------------------------------
    def run(self) -> SearchResult:
        study = self.open_study()
        worker = Worker(self.script, self.s.function, device=self.s.device, index=self.s.index,
                        memory_limit=self.limit, usable_bytes=int(self.usable), log_dir=self.run_dir)
        try:
            return self._run(study, worker)
        finally:
            worker.close()

    def _run(self, study: optuna.Study, worker: Worker) -> SearchResult:
        info = worker.start()
        options = SearchOptions(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in (info.options or {}).items()}) \
            if info.options else SearchOptions()
        options = options.merged(global_batch=self.s.global_batch, batch_size=self.s.batch_size,
                                 precision=self.s.precision, accumulation=self.s.accumulation)
        meta = study.user_attrs.get("autofit") or {}
        space = self.build_space(options, info, meta.get("knobs"))
        self._save_meta(study, info, space, meta.get("knobs"))
        planner = Planner(space, self.usable, check_noise=self.s.recheck)
        sampler = AutofitSampler(planner, self._distributions(space), seed=self.s.seed)
        study.sampler = sampler
        self.reporter.started(self, space, len(study.trials))
        stopped = "the planner had nothing left worth probing"
        try:
            stopped = self._explore(study, worker, planner, sampler, options, info)
            planner = Planner(self._space(study), self.usable, check_noise=self.s.recheck)
            self._remeasure_and_confirm(study, worker, planner, sampler)
            partial = False
        except KeyboardInterrupt:
            stopped, partial = "interrupted (Ctrl-C)", True
            worker.close()
            fail_trials(study, self._asked)
        except BaseException:
            # autofit's own failure (a bug, a broken pipe to the worker): the finished probes stay,
            # the unfinished one is FAIL and is probed again when the same command resumes.
            worker.close()
            fail_trials(study, self._asked)
            raise
        return self._finish(study, planner, stopped, partial, info)

    def _explore(self, study, worker, planner: Planner, sampler: AutofitSampler, options, info) -> str:
        while True:
            if self.s.trials is not None and self.probes_this_run >= self.s.trials:
                return f"reached --trials {self.s.trials}"
            seen = observations(study.get_trials(deepcopy=False))
            if self.budget.left() < self.budget.next_probe_estimate(seen) + self.budget.confirm_reserve(planner, seen, study):
                return "the time budget"
            suspect = planner.recheck(seen)  # a measurement to trust only once measured again
            if suspect is not None:
                self._probe(study, worker, sampler, suspect, "recheck", self.s.steps)
                continue
            config = planner.next(seen)
            if config is None:
                return "the planner had nothing left worth probing"
            result = self._probe(study, worker, sampler, config, "explore", self.s.steps)
            if result is None:
                continue  # another worker claimed the same config first
            self._check_fatal(result, seen)
            meta = study.user_attrs.get("autofit") or {}
            if meta.get("knobs") is None and result.knobs.get("batches"):
                space = self.build_space(options, info, result.knobs)
                self._save_meta(study, info, space, result.knobs)
                planner.space = space
                sampler.search_space = self._distributions(space)

    def _remeasure_and_confirm(self, study, worker, planner: Planner, sampler: AutofitSampler) -> None:
        seen = observations(study.get_trials(deepcopy=False))
        ranked = planner.ranked(seen)
        if not ranked:
            return
        # Noise: the close contenders get a second, longer measurement before a winner is named.
        for candidate in ranked[:3]:
            if candidate.samples_per_s < 0.95 * ranked[0].samples_per_s or candidate.probes > 1:
                continue
            if self.budget.left() < self.budget.confirm_estimate(study, candidate.config, self.s.steps * 2) \
                    + self.budget.confirm_reserve(planner, seen, study):
                break
            self._probe(study, worker, sampler, candidate.config, "remeasure", self.s.steps * 2)
        # Confirm the winner with a long run; fall back to the next one if it fails or crosses the headroom.
        for _ in range(3):
            seen = observations(study.get_trials(deepcopy=False))
            ranked = planner.ranked(seen)
            if not ranked or any(o.phase == "confirm" and o.config == ranked[0].config for o in seen):
                return
            steps = self.budget.confirm_steps(study, ranked[0].config)
            if steps is None:
                self.notes.append("the winner was not confirmed with a longer run: the budget ran out")
                return
            result = self._probe(study, worker, sampler, ranked[0].config, "confirm", steps)
            if result is not None and result.ok and (result.peak_bytes or 0) <= self.usable:
                continue  # confirmed; if its longer run moved it down the ranking, confirm the new first
            self.notes.append(f"{ranked[0].config.label()} failed its confirmation run "
                              f"({result.status if result else 'claimed'}); falling back to the next best")

    def _probe(self, study, worker: Worker, sampler: AutofitSampler, config: Config, phase: str, steps: int):
        sampler.force(config)
        with quiet_heartbeat_warnings():
            trial = study.ask(sampler.search_space)
        self._asked.append(trial.number)
        asked = Config(batch_size=trial.params["batch_size"], precision=trial.params["precision"],
                       checkpoint_segments=trial.params["checkpoint_segments"],
                       accumulation_steps=trial.params["accumulation_steps"])
        if phase == "explore" and self._claimed_earlier(study, trial.number, asked):
            trial.set_user_attr("duplicate", True)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return None
        trial.set_user_attr("phase", phase)
        trial.set_user_attr("owner", owner_record())
        self.reporter.probe_started(trial.number, asked, phase)
        log_path = os.path.join(self.run_dir, f"trial-{trial.number}.log")
        os.makedirs(self.run_dir, exist_ok=True)
        seen = observations(study.get_trials(deepcopy=False), exclude=trial.number)
        with Heartbeat(study, trial):
            result = worker.probe(asked, warmup=self.s.warmup, steps=steps,
                                  timeout=self.budget.probe_timeout(seen), log_path=log_path)
        record_probe(study, trial, result, self.usable, phase)
        self.probes_this_run += 1
        self.reporter.probe_finished(trial.number, result, self.usable)
        return result

    def _claimed_earlier(self, study, number: int, config: Config) -> bool:
        """Another process asked for the same config first (parallel workers): the lower trial
        number keeps it, so exactly one of two racing workers probes it."""
        for other in study.get_trials(deepcopy=False):
            if other.number < number and not other.user_attrs.get("duplicate") \
                    and other.user_attrs.get("phase", "explore") == "explore" and trial_config(other) == config \
                    and (other.state == optuna.trial.TrialState.RUNNING or "probe" in other.user_attrs):
                return True
        return False

    def _check_fatal(self, result: ProbeResult, seen) -> None:
        if result.status == "error" and not any(o.status in ("ok", "oom") for o in seen):
            raise UserCodeError(
                f"The training function raised on the first probe ({result.config.label()}): "
                f"{result.error_type}: {(result.error_message or '').splitlines()[0] if result.error_message else ''}\n"
                f"{result.traceback or ''}".rstrip()
                + f"\nFix the error (its output is in {result.log_path}); nothing was exported."
            )

    # --- bookkeeping --------------------------------------------------------------------------
    def _distributions(self, space: SearchSpace):
        return distributions(
            (min(space.batch_sizes), max(space.batch_sizes)),
            max(space.checkpoint_segments),
            max(space.global_batch or 1, max(space.accumulations)),
        )

    def _space(self, study) -> SearchSpace:
        return SearchSpace.from_dict(study.user_attrs["autofit"]["space"])

    def _save_meta(self, study, info, space: SearchSpace, knobs: dict | None) -> None:
        study.set_user_attr("autofit", {
            "script": self.script, "function": info.function, "device": self.device_info.name,
            "device_info": self.device_info.to_dict(), "limit_bytes": self.limit,
            "limit_given": self.s.memory_limit is not None, "script_sha256": self.script_sha256,
            "headroom": self.s.headroom, "usable_bytes": self.usable, "space": space.to_dict(),
            "knobs": knobs, "versions": info.versions,
        })

    def _finish(self, study, planner: Planner, stopped: str, partial: bool, info) -> SearchResult:
        seen = observations(study.get_trials(deepcopy=False))
        self.notes[:0] = fault_notes(study, planner, seen)
        noisy = planner.noise_summary(seen)
        if noisy:
            self.notes.append(noisy)
        done = [o for o in seen if o.status != "running"]
        ranked = planner.ranked(seen)
        record_end(study, stopped, partial)
        result = SearchResult(
            best=ranked[0].config if ranked else None, document=None, json_path=None, ranked=ranked,
            study_name=self.study_name, storage=self.storage_url, probes=len(done),
            ooms=sum(o.too_big(self.usable) for o in done), failed=sum(o.failed for o in done),
            elapsed_s=time.monotonic() - self.started, stopped=stopped, partial=partial,
            usable_bytes=self.usable, notes=self.notes,
        )
        if not ranked:
            if partial:
                return result
            raise NoFeasibleConfig(nothing_fits(done, self.usable, self.limit, self.s.headroom))
        document = best_document(study, self.storage_url, planner=planner, stopped=stopped, partial=partial)
        result.why = document["why"]
        path = self.s.out or default_best_path(self.script, info.function, os.path.dirname(self._db_dir()),
                                               device_tag(self.device_info.type, self.device_info.name))
        lowered_note = _lowered_run_note(path)
        if lowered_note:
            result.notes.append(lowered_note)
        result.json_path = write_best(path, document)
        result.document = document
        return result


def _lowered_run_note(best_path: str) -> str | None:
    """What a real run with the previous answer recorded when it ran out of memory, if it did."""
    from autofit.resilience import lowered_path, read_lowerings

    recorded = read_lowerings(lowered_path(best_path))
    if not recorded or not recorded.get("lowerings"):
        return None
    first = recorded["lowerings"][0]
    before, after = Config.from_dict(first["before"]), Config.from_dict(recorded["ended_with"])
    return (f"a real run of {before.label()} ran out of memory at step {first['step']} ({first['where']}) and went "
            f"on with {after.label()} ({lowered_path(best_path)}): if its inputs grow beyond what the probes "
            f"saw, keep more --headroom or probe with the largest inputs")
