"""The search's loop: explore with the planner, recheck suspect measurements, re-measure the close
contenders, confirm the winner with a long run, export it. Every probe is an Optuna trial."""

from __future__ import annotations

import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import optuna

from autofit.config import SHARDINGS, Config, device_shardings
from autofit.devices import check_device, current_allocator_settings
from autofit.errors import NoFeasibleConfig, UsageError, UserCodeError
from autofit.export import default_best_path, device_tag, script_sha256, write_best
from autofit.memory import Estimator
from autofit.options import SearchOptions
from autofit.planner import Planner, SearchSpace
from autofit.probing import JobBoard, ProbeResult, Worker, check_script, make_runner
from autofit.search._budget import Budget
from autofit.search._estimates import estimate_space
from autofit.search._liveness import Heartbeat, fail_stale, owner_record
from autofit.search._progress import Reporter
from autofit.search._resume import fail_trials, open_study
from autofit.search._sampler import AutofitSampler
from autofit.search._settings import SearchResult, SearchSettings
from autofit.study import (
    HEARTBEAT_S,
    best_document,
    default_study_name,
    distributions,
    fault_notes,
    nothing_fits,
    observations,
    open_storage,
    quiet_heartbeat_warnings,
    record_end,
    record_probe,
    storage_label,
    stored_estimates,
    trial_config,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


class Search:
    """One search's state; `run()` drives it. Split into steps so each reads on its own."""

    def __init__(self, settings: SearchSettings, reporter: Reporter) -> None:
        self.s = settings
        self.reporter = reporter
        self.started = time.monotonic()
        self.budget = Budget(settings, self.started)
        self.script = check_script(settings.script)
        self.slots = settings.worker_indices()
        """The device index of each worker: one per listed GPU, or --workers of them on the CPU."""
        self.device_info = _same_devices(settings.device, self.slots)
        self._worker_names: dict[int, str] = {}
        self.storage_url = storage_label(settings.storage)
        self.storage = open_storage(settings.storage)  # a bad storage fails before any probe
        self.study_name = settings.study or default_study_name(self.script, settings.function, settings.device, settings.index) \
            + (f"-{settings.world_size}ranks" if settings.world_size > 1 else "")
        self.run_dir = os.path.join(os.path.dirname(self._db_dir()), "runs", self.study_name)
        self.limit = settings.memory_limit or self._device_memory()
        self.usable = self.limit * (1 - settings.headroom)
        self.probes_this_run = 0
        self.script_sha256 = script_sha256(self.script)  # the script as these probes measure it
        self.notes: list[str] = []
        if settings.device == "cpu" and len(self.slots) > 1:
            self.notes.append(_shared_cores_note(len(self.slots)))
        self._asked: list[int] = []
        self._board: JobBoard | None = None  # several nodes: where node 0 posts its probes
        self._estimator: Estimator | None = None
        self._session: str | None = None

    def _db_dir(self) -> str:
        url = self.storage_url
        if url.startswith("sqlite:///"):
            return os.path.abspath(url[len("sqlite:///"):])
        return os.path.abspath(os.path.join("studies", "x"))

    def _device_memory(self) -> int:
        info = self.device_info
        if info.type == "cpu":  # no limit given: cap at what is free now, so the machine survives
            return int((info.free_bytes or info.total_bytes) / len(self.slots))  # each worker its share
        return int(info.total_bytes)

    # --- set-up -------------------------------------------------------------------------------
    def open_study(self) -> optuna.Study:
        opened = open_study(self.storage, self.study_name, fresh=self.s.fresh, device_name=self.device_info.name,
                            limit_bytes=self.limit, limit_given=self.s.memory_limit is not None,
                            headroom=self.s.headroom, script_sha256=self.script_sha256,
                            world_size=self.s.world_size)
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
        global_batch = options.global_batch
        world = self.s.world_size
        if global_batch and world > 1:  # the micro-batch and accumulation are per rank
            if global_batch % world:
                raise UsageError(f"The global batch must divide among the {world} ranks, but got {global_batch}.")
            global_batch //= world
        shardings = ("ddp",)  # one process, or a function that offers no blocks to shard
        if world > 1 and knobs is not None and knobs.get("shard_blocks"):
            shardings = tuple(h for h in options.sharding or SHARDINGS if h in device_shardings(self.s.device))
        compiles = (False, True) if knobs and knobs.get("compile") and options.compile else (False,)
        return SearchSpace.build(batch_range=options.batch_size, precisions=tuple(wanted),
                                 checkpoint_blocks=blocks, use_checkpoint=options.checkpoint,
                                 global_batch=global_batch, accumulations=accumulations, shardings=shardings,
                                 compiles=compiles)

    # --- the loop -----------------------------------------------------------------------------
    def run(self) -> SearchResult:
        study = self.open_study()
        many = len(self.slots) > 1
        if self.s.nnodes > 1:
            self._board = JobBoard(self.storage, self.study_name)
            self._session = self._board.open_session(self.s.nnodes, self.s.nproc_per_node)
        env = {"PYTORCH_CUDA_ALLOC_CONF": self.s.alloc_conf} if self.s.alloc_conf else None
        workers = [make_runner(self.script, self.s.function, device=self.s.device, index=index,
                               memory_limit=self.limit, usable_bytes=int(self.usable), env=env,
                               log_dir=os.path.join(self.run_dir, f"worker-{n}") if many else self.run_dir,
                               nproc=self.s.nproc_per_node, nnodes=self.s.nnodes, rdzv_endpoint=self.s.rdzv_endpoint,
                               board=self._board, session=self._session)
                   for n, index in enumerate(self.slots)]
        self._worker_names = {id(w): f"cuda:{w.index}" if w.device == "cuda" else f"worker {n}"
                              for n, w in enumerate(workers)}
        # Each worker is started and probed from its own thread, which lives as long as the search:
        # a worker process dies with the thread that started it (PR_SET_PDEATHSIG is per thread).
        self._lanes = {id(w): ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"autofit-worker-{n}")
                       for n, w in enumerate(workers)}
        try:
            return self._run(study, workers)
        finally:
            if self._board is not None:
                self._board.close_session(self._session)  # the followers' cue to stop
            for worker in workers:
                worker.close()
            if self._estimator is not None:
                self._estimator.close()
            for lane in self._lanes.values():
                lane.shutdown(wait=False, cancel_futures=True)

    def _run(self, study: optuna.Study, workers: list[Worker]) -> SearchResult:
        wanted = self.s.estimate and self.s.world_size == 1 and stored_estimates(study) is None
        self._estimator = Estimator(self.script, self.s.function) if wanted else None
        starts = [self._lanes[id(w)].submit(w.start) for w in workers]  # every worker loads at once
        info = [start.result() for start in starts][0]
        if self._estimator is not None:
            self._estimator.wait_ready()  # loaded before the first probe, so as not to slow it
        options = SearchOptions(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in (info.options or {}).items()}) \
            if info.options else SearchOptions()
        options = options.merged(global_batch=self.s.global_batch, batch_size=self.s.batch_size,
                                 precision=self.s.precision, accumulation=self.s.accumulation,
                                 sharding=self.s.sharding, compile=self.s.compile)
        meta = study.user_attrs.get("autofit") or {}
        space = self.build_space(options, info, meta.get("knobs"))
        self._save_meta(study, info, space, meta.get("knobs"))
        planner = Planner(space, self.usable, check_noise=self.s.recheck)
        sampler = AutofitSampler(planner, self._distributions(space), seed=self.s.seed)
        study.sampler = sampler
        self.reporter.started(self, space, len(study.trials))
        if meta.get("knobs") is not None:  # resumed: the space is known, and so may the estimates be
            self._attach_estimates(study, planner, space, info)
        stopped = "the planner had nothing left worth probing"
        try:
            stopped = self._explore(study, workers, planner, sampler, options, info)
            planner = Planner(self._space(study), self.usable, check_noise=self.s.recheck,
                              prediction=planner.prediction)
            # One worker, alone: the figures a winner is named and exported with are measured
            # without the other workers' probes competing for the machine.
            self._remeasure_and_confirm(study, workers[0], planner, sampler)
            partial = False
        except KeyboardInterrupt:
            stopped, partial = "interrupted (Ctrl-C)", True
            for worker in workers:
                worker.close()
            fail_trials(study, self._asked)
        except BaseException:
            # autofit's own failure (a bug, a broken pipe to the worker): the finished probes stay,
            # the unfinished ones are FAIL and are probed again when the same command resumes.
            for worker in workers:
                worker.close()
            fail_trials(study, self._asked)
            raise
        return self._finish(study, planner, stopped, partial, info)

    def _explore(self, study, workers: list[Worker], planner: Planner, sampler: AutofitSampler, options, info) -> str:
        """Keep every worker busy with the planner's next config (or a suspect one to recheck) until
        the budget, --trials or the planner stop it; record each probe as it finishes."""
        free = list(workers)
        running: dict[Future, tuple[Worker, optuna.Trial, str]] = {}
        stopped: str | None = None
        next_liveness_check = time.monotonic() + HEARTBEAT_S
        knobs_known = False  # once known, always known: no need to read the study again
        try:
            while True:
                knobs_known = knobs_known or (study.user_attrs.get("autofit") or {}).get("knobs") is not None
                while free and stopped is None and (knobs_known or not running):
                    launch = self._next_probe(study, planner, len(running))
                    if isinstance(launch, str):
                        stopped = launch
                    elif launch is None:
                        break  # nothing new until a running probe reports
                    else:
                        config, phase = launch
                        worker = free.pop()
                        started = self._start_probe(study, sampler, worker, config, phase, self.s.steps)
                        if started is None:
                            free.append(worker)  # another searcher claimed the config first
                            continue
                        running[started[0]] = (worker, started[1], phase)
                if not running:
                    if stopped is not None:
                        return stopped
                    time.sleep(1.0)  # another searcher's probes are running: what they find decides
                    done = set()
                else:
                    done, _ = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
                for future in done:
                    worker, trial, phase = running.pop(future)
                    free.append(worker)
                    result = self._finish_probe(study, trial, future.result(), phase, worker)
                    if phase == "explore":
                        self._check_fatal(result, observations(study.get_trials(deepcopy=False), exclude=trial.number))
                        self._learn_knobs(study, result, options, info, planner, sampler)
                if time.monotonic() >= next_liveness_check:  # a searcher that died: its configs
                    fail_stale(study)                         # are probed again (by anyone)
                    next_liveness_check = time.monotonic() + HEARTBEAT_S
        finally:
            for worker, _, _ in running.values():  # an interruption or a fault: stop them at once
                worker.kill()

    def _next_probe(self, study, planner: Planner, running: int) -> tuple[Config, str] | str | None:
        """What a free worker probes next: (config, phase); a reason (str) to stop launching; or None
        when nothing is worth probing until the probes running now report."""
        if self.s.trials is not None and self.probes_this_run + running >= self.s.trials:
            return f"reached --trials {self.s.trials}"
        seen = observations(study.get_trials(deepcopy=False))
        if self.budget.left() < self.budget.next_probe_estimate(seen) + self.budget.confirm_reserve(planner, seen, study):
            return "the time budget"
        suspect = planner.recheck(seen)  # a measurement to trust only once measured again
        if suspect is not None:
            return suspect, "recheck"
        config = planner.next(seen)
        if config is None:
            if running or any(o.status == "running" for o in seen):
                return None  # what the probes running now (here or in another searcher) find decides
            return "the planner had nothing left worth probing"
        return config, "explore"

    def _learn_knobs(self, study, result: ProbeResult, options, info, planner: Planner, sampler: AutofitSampler) -> None:
        """The first probe tells which knobs the function offers: the space narrows to them."""
        meta = study.user_attrs.get("autofit") or {}
        if meta.get("knobs") is None and result.knobs.get("batches"):
            space = self.build_space(options, info, result.knobs)
            self._save_meta(study, info, space, result.knobs)
            planner.space = space
            sampler.search_space = self._distributions(space)
            self._attach_estimates(study, planner, space, info)

    def _attach_estimates(self, study, planner: Planner, space: SearchSpace, info) -> None:
        """Give the planner the memory estimator's predictions: kept on the study, or asked now
        (no probe runs meanwhile). A failed estimator is reported; the search goes on without it."""
        if not self.s.estimate or self.s.world_size > 1:  # ranks' sharded memory: not estimated yet
            return
        stored = stored_estimates(study)
        if stored is None:
            if self._estimator is None:  # resumed from a study written without estimates
                self._estimator = Estimator(self.script, self.s.function)
            self.reporter.note("asking the memory estimator (fake tensors, no memory spent) ...")
            stored = estimate_space(study, self._estimator, space, self.s.budget_s, self.limit)
            self._estimator.close()  # its work is done: its memory goes back
            self._estimator = None
            self.reporter.note(stored.summary())
            if stored.error:
                self.notes.append(stored.summary())
        planner.prediction = stored.prediction(self.device_info.type)

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
        """One probe, start to finish, on `worker` (None when another searcher claimed the config)."""
        started = self._start_probe(study, sampler, worker, config, phase, steps)
        if started is None:
            return None
        return self._finish_probe(study, started[1], started[0].result(), phase, worker)

    def _start_probe(self, study, sampler: AutofitSampler, worker: Worker, config: Config, phase: str,
                     steps: int) -> tuple[Future, optuna.Trial] | None:
        """Ask Optuna for the trial (in this thread) and run its probe in the worker's own thread."""
        sampler.force(config)
        with quiet_heartbeat_warnings():
            trial = study.ask(sampler.search_space)
        self._asked.append(trial.number)
        asked = trial_config(trial)
        if phase == "explore" and self._claimed_earlier(study, trial.number, asked):
            trial.set_user_attr("duplicate", True)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return None
        trial.set_user_attr("phase", phase)
        trial.set_user_attr("owner", {**owner_record(), "device": f"{worker.device}:{worker.index}"})
        self.reporter.probe_started(trial.number, asked, phase)
        log_path = os.path.join(self.run_dir, f"trial-{trial.number}.log")
        os.makedirs(self.run_dir, exist_ok=True)
        seen = observations(study.get_trials(deepcopy=False), exclude=trial.number)
        timeout = self.budget.probe_timeout(seen)

        across_nodes = {"trial_id": trial._trial_id} if self.s.nnodes > 1 else {}

        def measure() -> ProbeResult:
            with Heartbeat(study, trial):
                return worker.probe(asked, warmup=self.s.warmup, steps=steps, timeout=timeout, log_path=log_path,
                                    **across_nodes)

        return self._lanes[id(worker)].submit(measure), trial

    def _finish_probe(self, study, trial: optuna.Trial, result: ProbeResult, phase: str, worker: Worker) -> ProbeResult:
        record_probe(study, trial, result, self.usable, phase)
        self.probes_this_run += 1
        where = self._worker_names.get(id(worker)) if len(self.slots) > 1 else None
        self.reporter.probe_finished(trial.number, result, self.usable, where)
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
            sharded=space.shardings != ("ddp",),
            compiled=True in space.compiles,
        )

    def _space(self, study) -> SearchSpace:
        return SearchSpace.from_dict(study.user_attrs["autofit"]["space"])

    def _save_meta(self, study, info, space: SearchSpace, knobs: dict | None) -> None:
        study.set_user_attr("autofit", {
            "script": self.script, "function": info.function, "device": self.device_info.name,
            "device_info": self.device_info.to_dict(), "limit_bytes": self.limit,
            "limit_given": self.s.memory_limit is not None, "script_sha256": self.script_sha256,
            "headroom": self.s.headroom, "usable_bytes": self.usable, "space": space.to_dict(),
            "world_size": self.s.world_size, "allocator": current_allocator_settings(self.s.alloc_conf),
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


def _shared_cores_note(workers: int) -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{workers} workers shared {cores} cores, each probe with the threads your run gets: their probes slowed "
            f"each other, so the ranking (and the answer) may be off; one worker gives the answer to trust "
            f"(benchmarks/parallel.md)")


def _same_devices(device: str, indices: tuple[int, ...]):
    """The device all workers run on: probes compare only across identical devices (same model and
    memory), so a list of GPUs that differ is refused."""
    infos = [check_device(device, index) for index in dict.fromkeys(indices)]
    first = infos[0]
    for other in infos[1:]:
        if (other.name, other.total_bytes) != (first.name, first.total_bytes):
            raise UsageError(f"The GPUs of one search must be identical (probes compare only on the same model and "
                             f"memory), but {device}:{first.index} is {first.name} and {device}:{other.index} is "
                             f"{other.name}: search each model separately.")
    return first


def _lowered_run_note(best_path: str) -> str | None:
    """What a real run with the previous answer recorded when it ran out of memory, if it did."""
    from autofit.runtime import lowered_path, read_lowerings

    recorded = read_lowerings(lowered_path(best_path))
    if not recorded or not recorded.get("lowerings"):
        return None
    first = recorded["lowerings"][0]
    before, after = Config.from_dict(first["before"]), Config.from_dict(recorded["ended_with"])
    return (f"a real run of {before.label()} ran out of memory at step {first['step']} ({first['where']}) and went "
            f"on with {after.label()} ({lowered_path(best_path)}): if its inputs grow beyond what the probes "
            f"saw, keep more --headroom or probe with the largest inputs")
