"""run_search: probes chosen by the planner, recorded in Optuna, winner confirmed and exported."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import optuna

from autofit.api import SearchOptions
from autofit.devices import check_device
from autofit.discover import check_script
from autofit.errors import NoFeasibleConfig, UsageError, UserCodeError
from autofit.record import ProbeResult
from autofit.results import default_best_path, device_tag, script_sha256, write_best
from autofit.search._planner import TIE_TOLERANCE, Candidate, Planner
from autofit.search._progress import Reporter
from autofit.search._sampler import AutofitSampler
from autofit.search._space import SearchSpace
from autofit.search._study import (
    DATA_BOUND_ERRORS,
    Heartbeat,
    fail_stale,
    owner_record,
    quiet_heartbeat_warnings,
    default_study_name,
    distributions,
    observations,
    open_storage,
    record_probe,
    storage_label,
)
from autofit.space import Config
from autofit.units import format_size
from autofit.worker import Worker

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass
class SearchSettings:
    """Everything one search needs; the CLI and `train.search()` both fill this in."""

    script: str
    function: str | None = None
    device: str = "cpu"
    index: int = 0
    memory_limit: int | None = None
    headroom: float = 0.1
    budget_s: float = 1200.0
    trials: int | None = None
    global_batch: int | None = None
    batch_size: tuple[int, int] | None = None
    precision: tuple[str, ...] | None = None
    accumulation: tuple[int, ...] | None = None
    study: str | None = None
    storage: str | None = None
    out: str | None = None
    fresh: bool = False
    warmup: int = 2
    steps: int = 5
    probe_timeout: float | None = None
    confirm_factor: int = 10
    seed: int | None = 0

    def __post_init__(self) -> None:
        if not 0 <= self.headroom < 1:
            raise UsageError(f"The headroom must be a fraction in [0, 1), but got {self.headroom}.")
        if self.trials is not None and self.trials < 1:
            raise UsageError(f"The number of trials must be at least 1, but got {self.trials}.")


@dataclass
class SearchResult:
    best: Config | None
    document: dict | None
    json_path: str | None
    ranked: list[Candidate]
    study_name: str
    storage: str
    probes: int
    ooms: int
    failed: int
    elapsed_s: float
    stopped: str
    partial: bool = False
    why: str = ""
    usable_bytes: float | None = None
    notes: list[str] = field(default_factory=list)

    def trials_frame(self):
        """The study's probes as a pandas DataFrame (see autofit.frame.COLUMNS)."""
        from autofit.frame import trials_frame

        study = optuna.load_study(study_name=self.study_name, storage=open_storage(self.storage))
        return trials_frame(study.get_trials(deepcopy=False), self.usable_bytes)


class _Search:
    """One search's state; `run()` drives it. Split into steps so each reads on its own."""

    def __init__(self, settings: SearchSettings, reporter: Reporter) -> None:
        self.s = settings
        self.reporter = reporter
        self.started = time.monotonic()
        self.deadline = self.started + settings.budget_s
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
        if self.s.fresh:
            try:
                optuna.delete_study(study_name=self.study_name, storage=self.storage)
            except KeyError:
                pass
        study = optuna.create_study(study_name=self.study_name, storage=self.storage,
                                    direction="maximize", load_if_exists=True)
        meta = study.user_attrs.get("autofit")
        if meta is not None:
            if self.s.memory_limit is None and not meta.get("limit_given", True):
                # No --memory-limit, then or now: the limit was the memory free when the study began
                # (it changes every run); resume with that one.
                self.limit = int(meta["limit_bytes"])
                self.usable = self.limit * (1 - self.s.headroom)
            for key, value in (("device", self.device_info.name), ("limit_bytes", self.limit),
                               ("headroom", self.s.headroom)):
                if meta.get(key) != value:
                    raise UsageError(
                        f"The study {self.study_name} must be resumed with the same {key.replace('_', ' ')} "
                        f"({meta.get(key)}), but got {value}: pass --fresh to start over or --study to name another."
                    )
        if meta is not None and meta.get("script_sha256") not in (None, self.script_sha256):
            self.notes.append("the script changed since this study began: its earlier probes measured the old "
                              "version (pass --fresh to start over)")
        stale = fail_stale(study)
        if stale:
            self.notes.append(f"trials {', '.join(map(str, stale))} were left running by a searcher that died "
                              f"(killed, or out of memory); their configs are probed again")
        return study

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
        planner = Planner(space, self.usable)
        sampler = AutofitSampler(planner, self._distributions(space), seed=self.s.seed)
        study.sampler = sampler
        self.reporter.started(self, space, len(study.trials))
        stopped = "the planner had nothing left worth probing"
        try:
            stopped = self._explore(study, worker, planner, sampler, options, info)
            planner = Planner(self._space(study), self.usable)
            self._remeasure_and_confirm(study, worker, planner, sampler)
            partial = False
        except KeyboardInterrupt:
            stopped, partial = "interrupted (Ctrl-C)", True
            worker.close()
            self._fail_running(study)
        except BaseException:
            # autofit's own failure (a bug, a broken pipe to the worker): the finished probes stay,
            # the unfinished one is FAIL and is probed again when the same command resumes.
            worker.close()
            self._fail_running(study)
            raise
        return self._finish(study, planner, stopped, partial, info)

    def _explore(self, study, worker, planner: Planner, sampler: AutofitSampler, options, info) -> str:
        while True:
            if self.s.trials is not None and self.probes_this_run >= self.s.trials:
                return f"reached --trials {self.s.trials}"
            seen = observations(study.get_trials(deepcopy=False))
            if self._budget_left() < self._next_probe_estimate(seen) + self._confirm_reserve(planner, seen, study):
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
            if self._budget_left() < self._confirm_estimate(study, candidate.config, self.s.steps * 2) \
                    + self._confirm_reserve(planner, seen, study):
                break
            self._probe(study, worker, sampler, candidate.config, "remeasure", self.s.steps * 2)
        # Confirm the winner with a long run; fall back to the next one if it fails or crosses the headroom.
        for _ in range(3):
            seen = observations(study.get_trials(deepcopy=False))
            ranked = planner.ranked(seen)
            if not ranked or any(o.phase == "confirm" and o.config == ranked[0].config for o in seen):
                return
            steps = self._confirm_steps(study, ranked[0].config)
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
                                  timeout=self._probe_timeout(seen), log_path=log_path)
        record_probe(study, trial, result, self.usable, phase)
        self.probes_this_run += 1
        self.reporter.probe_finished(trial.number, result, self.usable)
        return result

    def _claimed_earlier(self, study, number: int, config: Config) -> bool:
        """Another process asked for the same config first (parallel workers): the lower trial
        number keeps it, so exactly one of two racing workers probes it."""
        from autofit.search._study import trial_config

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

    # --- time -----------------------------------------------------------------------------------
    def _confirm_steps(self, study, config: Config) -> int | None:
        """The confirmation's length: confirm_factor x the probe's steps, shortened to fit the budget
        (at least 2x, or None when not even that fits)."""
        for factor in (self.s.confirm_factor, 5, 3, 2):
            steps = self.s.steps * factor
            if self._confirm_estimate(study, config, steps) <= self._budget_left():
                return steps
        return None

    def _budget_left(self) -> float:
        return self.deadline - time.monotonic()

    def _next_probe_estimate(self, seen) -> float:
        walls = [o.wall_s for o in seen if o.status != "running"][-3:]
        return max(walls) if walls else 0.0

    def _confirm_estimate(self, study, config: Config, steps: int) -> float:
        """Seconds a probe of `config` with `steps` measured steps should take, from its last probe."""
        from autofit.search._study import trial_config, trial_result

        results = [r for t in study.get_trials(deepcopy=False)
                   if trial_config(t) == config and (r := trial_result(t)) and r.ok]
        if not results:
            return 0.0
        last = results[-1]
        # step_time_median_s is per optimizer step, which already holds all accumulation micro-batches.
        extra_steps = max(0, steps - last.measured_steps) * (last.step_time_median_s or 0)
        return last.wall_s + extra_steps

    def _confirm_reserve(self, planner: Planner, seen, study=None) -> float:
        """Time kept back for the winner's long run: at most a quarter of the budget."""
        ranked = planner.ranked(seen)
        if not ranked or study is None:
            return 0.0
        estimate = self._confirm_estimate(study, ranked[0].config, self.s.steps * self.s.confirm_factor)
        return min(estimate, 0.25 * self.s.budget_s)

    def _probe_timeout(self, seen) -> float:
        if self.s.probe_timeout:
            return self.s.probe_timeout
        walls = [o.wall_s for o in seen if o.status == "ok"]
        derived = max(30.0, 5 * max(walls) * self.s.confirm_factor) if walls else max(60.0, 0.25 * self.s.budget_s)
        return min(derived, max(30.0, self._budget_left()))

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

    def _fail_running(self, study) -> None:
        """Trials this process asked for and never finished (Ctrl-C) are FAIL, never left RUNNING,
        so the config is probed again on resume."""
        for number in self._asked:
            try:
                study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            except Exception:  # noqa: BLE001 - already finished or removed: nothing to do
                continue

    def _fault_notes(self, study, planner: Planner, seen) -> list[str]:
        """What went wrong along the way, one line each: unusable precisions, crashes, leaks."""
        from autofit.search._study import trial_result

        notes = []
        unusable = planner.unusable_precisions(seen)
        for trial in study.get_trials(deepcopy=False):
            result = trial_result(trial)
            if result is None:
                continue
            if result.config.precision in unusable and result.status in ("error", "diverged"):
                notes.append(f"{result.config.precision} is unusable here: {result.error_type}: "
                             f"{(result.error_message or '').splitlines()[0][:200]} (trial {trial.number})")
                unusable.discard(result.config.precision)
            elif result.error_type in DATA_BOUND_ERRORS and trial.user_attrs.get("phase") != "confirm" \
                    and any(o.status == "ok" for o in seen):
                notes.append(f"batch {result.config.batch_size} is more than the data can feed (the function ran "
                             f"out of batches before the probe's steps): the climb stopped below it (trial {trial.number})")
            elif result.status in ("crashed", "timeout"):
                notes.append(f"trial {trial.number} ({result.config.label()}) {result.status}: "
                             f"{(result.error_message or '').splitlines()[0][:200]}")
            notes.extend(f"trial {trial.number}: {note}" for note in result.notes)
        return notes

    def _finish(self, study, planner: Planner, stopped: str, partial: bool, info) -> SearchResult:
        from autofit.export import best_document, record_end  # it imports this module: import on use

        seen = observations(study.get_trials(deepcopy=False))
        self.notes[:0] = self._fault_notes(study, planner, seen)
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
            raise NoFeasibleConfig(self._nothing_fits(done))
        document = best_document(study, self.storage_url, planner=planner, stopped=stopped, partial=partial)
        result.why = document["why"]
        path = self.s.out or default_best_path(self.script, info.function, os.path.dirname(self._db_dir()),
                                               device_tag(self.device_info.type, self.device_info.name))
        result.json_path = write_best(path, document)
        result.document = document
        return result

    def _nothing_fits(self, done) -> str:
        peaks = [o.peak_bytes for o in done if o.status == "ok" and o.peak_bytes]
        smallest = min(done, key=lambda o: o.config.batch_size).config.label() if done else "none"
        needed = (f"the smallest config tried ({smallest}) needed {format_size(min(peaks))}" if peaks
                  else f"even the smallest config tried ({smallest}) ran out of memory")
        failed = [o for o in done if o.failed]
        extra = f"; {len(failed)} probes failed (see autofit show)" if failed else ""
        return (f"Nothing fits under {format_size(self.usable)} usable "
                f"({format_size(self.limit)} limit, {self.s.headroom:.0%} headroom): {needed}{extra}.")


def explain(ranked: list[Candidate], done, planner: Planner, usable: float) -> str:
    """Why the winner won, in one sentence a person can check."""
    best = ranked[0]
    parts = [f"{best.config.label()}: {best.samples_per_s:,.1f} samples/s"]
    others = {}
    for c in ranked[1:]:
        key = c.config.precision
        if key != best.config.precision and key not in others:
            others[key] = c
    for precision, c in others.items():
        parts.append(f"{best.samples_per_s / c.samples_per_s:.2f}x the best {precision} config ({c.config.label()})")
    strategy = planner.space.strategy_of(best.config)
    larger = sorted((o for o in done if planner.space.strategy_of(o.config) == strategy
                     and o.config.batch_size > best.config.batch_size), key=lambda o: o.config.batch_size)
    if larger:
        o = larger[0]
        if o.data_bound:
            parts.append(f"batch {o.config.batch_size} is more than the data can feed (the loop ran out of batches)")
        elif o.status == "oom":
            parts.append(f"batch {o.config.batch_size} ran out of memory")
        elif o.status == "ok" and o.peak_bytes and o.peak_bytes > usable:
            parts.append(f"batch {o.config.batch_size} needs {format_size(o.peak_bytes)} > {format_size(usable)} usable")
        elif o.status == "ok" and o.samples_per_s:
            measured = next((c.samples_per_s for c in ranked if c.config == o.config), o.samples_per_s)
            if measured <= best.samples_per_s:
                parts.append(f"batch {o.config.batch_size} was no faster ({measured / best.samples_per_s:.2f}x)")
            else:
                parts.append(f"batch {o.config.batch_size} was within {TIE_TOLERANCE:.0%} "
                             f"({measured / best.samples_per_s:.2f}x) and needs more memory")
    else:
        memory = planner.space and _predicted_next(planner, best.config, done, usable)
        if memory:
            parts.append(memory)
    return "; ".join(parts)


def _predicted_next(planner: Planner, config: Config, done, usable: float) -> str | None:
    sizes = planner.space.batch_sizes
    if config.batch_size not in sizes or config.batch_size == sizes[-1]:
        return "it is the largest batch allowed (--batch-size)" if config.batch_size == sizes[-1] else None
    from autofit.search._planner import _State

    state = _State(planner.space, usable, done)
    nxt = sizes[sizes.index(config.batch_size) + 1]
    line = state.memory_model(planner.space.strategy_of(config))
    if line is None:
        return None
    if line(nxt) > usable:
        return f"batch {nxt} is predicted to need {format_size(line(nxt))} > {format_size(usable)} usable"
    return f"batch {nxt} was not probed (predicted to need {format_size(line(nxt))}, which fits)"


def run_search(settings: SearchSettings, reporter: Reporter | None = None) -> SearchResult:
    """Search the best config for `settings.script`; see SearchSettings for the knobs."""
    return _Search(settings, reporter or Reporter(quiet=True)).run()


def search_function(fn: Any, **kwargs: Any) -> SearchResult:
    """`train.search(budget="20m", memory_limit="2GiB", ...)` from Python."""
    import inspect

    from autofit.units import parse_duration, parse_size

    if "budget" in kwargs:
        kwargs["budget_s"] = parse_duration(kwargs.pop("budget"))
    if isinstance(kwargs.get("memory_limit"), str):
        kwargs["memory_limit"] = parse_size(kwargs["memory_limit"])
    reporter = kwargs.pop("reporter", None)
    script = inspect.getsourcefile(fn.fn)
    return run_search(SearchSettings(script=script, function=fn.fn.__name__, **kwargs), reporter)
