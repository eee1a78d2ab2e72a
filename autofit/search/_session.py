"""Where a search's probes are kept, and under what: the storage and the study (new, or resumed), the
device and memory limit the probes are measured under, the trials this search asked for and how they
end, and the liveness of every searcher's trials (a dead searcher's configs are probed again)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from datetime import datetime

import optuna

from autofit.devices import (
    DeviceInfo,
    check_device,
    check_memory_limit,
    current_allocator_settings,
    default_memory_limit,
    peak_flops_per_s,
)
from autofit.errors import UsageError
from autofit.export import MemoryBudget
from autofit.findings import observations
from autofit.knobs import Offers
from autofit.planner import Observation, SearchSpace
from autofit.probing import ProbeResult, ScriptVersion, WorkerInfo, check_script, decorated_name, pass_script_args
from autofit.redaction import redacted_args
from autofit.search._liveness import Heartbeat, fail_stale, owner_record
from autofit.search._resume import fail_trials, open_study
from autofit.search._sampler import AutofitSampler, Proposal
from autofit.search._settings import SearchSettings
from autofit.study import (
    CODE_ATTR,
    HEARTBEAT_S,
    MODULES_ATTR,
    SCRIPT_ATTR,
    StudyMeta,
    default_storage_url,
    default_study_name,
    is_journal,
    keep_meta,
    model_flops_per_sample,
    model_flops_per_token,
    open_storage,
    quiet_heartbeat_warnings,
    record_probe,
    script_trials,
    storage_file,
    storage_label,
    stored_meta,
    study_meta,
    trial_config,
)

CLAIM_WAIT_S = 5.0
"""How long a claim waits for an earlier trial's params (written by its searcher right after asking)."""


class Session:
    """One search's study and what its probes are measured under; `open()` opens or resumes the study."""

    def __init__(self, settings: SearchSettings) -> None:
        self.s = settings
        self.script = check_script(settings.script)
        pass_script_args(settings.script_args)  # every process that runs the script gets them
        self.slots = settings.worker_indices()
        """The device index of each worker: one per listed GPU, or --parallel of them on the CPU."""
        self.device_info = same_devices(settings.device, self.slots)
        check_memory_limit(settings.memory_limit, self.device_info)
        self.storage_label = storage_label(settings.storage)
        """The storage as it may be printed or written (a password masked)."""
        self.storage = open_storage(settings.storage)  # a bad storage fails before any probe
        self.study_name = settings.study or default_study_name(self.script, settings.function or decorated_name(self.script), settings.device,
                                                               settings.index) \
            + (f"-{settings.world_size}ranks" if settings.world_size > 1 else "")
        self.run_dir = os.path.join(self.output_dir, "runs", self.study_name)
        """Where the probes' logs go: one per trial (and per worker when there are several)."""
        self.memory_budget = MemoryBudget.of(settings.memory_limit or default_memory_limit(self.device_info, len(self.slots)),
                                      settings.headroom)
        """The memory the probes run against: the given limit, or the device's (a resumed study's own)."""
        self.version = ScriptVersion.of(self.script)
        """The script as these probes measure it: its code and its local modules' (read once, on first need)."""
        self.study: optuna.Study | None = None
        self.created = False
        """This search made the study (none of its name was in the storage before)."""
        self.notes: list[str] = []
        """What resuming found (a changed script, a dead searcher's trials)."""
        self._asked: list[int] = []
        self._next_liveness_check = 0.0

    @property
    def output_dir(self) -> str:
        """Where the study's storage lives (the best config and the probes' logs go beside it)."""
        url = self.s.storage or default_storage_url()
        path = storage_file(url)
        if path is not None and not is_journal(url):
            return os.path.dirname(os.path.abspath(path))
        return os.path.abspath("studies")

    def open(self) -> optuna.Study:
        """The study, new or resumed; a resumed one may bring its own limit (see open_study)."""
        opened = open_study(self.storage, self.study_name, fresh=self.s.fresh, device_name=self.device_info.name,
                            budget=self.memory_budget, limit_given=self.s.memory_limit is not None,
                            version=self.version,
                            world_size=self.s.world_size, script_args=redacted_args(self.s.script_args))
        self.memory_budget = opened.memory_budget
        self.notes.extend(opened.notes)
        self.study = opened.study
        self.created = opened.created
        self._next_liveness_check = time.monotonic() + HEARTBEAT_S
        return self.study

    def discard_if_unused(self) -> None:
        """A search that made its study and ended before its first probe (the script failed to load, a
        limit below what the worker needs to start) leaves no empty study for `autofit studies` to
        list. A study that was there before this search stays, trials or not; so does one that another
        searcher has probed in meanwhile."""
        if self.study is None or not self.created or self.study.get_trials(deepcopy=False):
            return
        try:
            optuna.delete_study(study_name=self.study_name, storage=self.storage)
        except KeyError:  # already gone
            pass

    # --- the search's settings on the study ---------------------------------------------------
    def offers(self) -> Offers | None:
        """What the function offers, once a probe (of any searcher of this study) reported it (a study of
        an older version kept the same dict: autofit.knobs' `Offers.from_dict` reads both)."""
        meta = stored_meta(self.study)
        return Offers.from_dict(meta.knobs) if meta else None

    def stored_space(self) -> SearchSpace:
        """The space as the study keeps it (narrowed by whichever searcher learnt the knobs first)."""
        return SearchSpace.from_dict(study_meta(self.study).space)

    def save_meta(self, info: WorkerInfo, space: SearchSpace, offers: Offers | None) -> None:
        known = stored_meta(self.study)
        keep_meta(self.study, StudyMeta(
            script=self.script, function=info.function, device_info=self.device_info.to_dict(),
            memory=self.memory_budget,
            limit_given=self.s.memory_limit is not None, script_sha256=self.version.sha256,
            code_sha256=self.version.code_sha256,
            modules=self.version.known((known.modules or {}) if known and not self._changed(known) else ()),
            script_args=tuple(redacted_args(self.s.script_args)), space=space.to_dict(), world_size=self.s.world_size,
            allocator=current_allocator_settings(self.s.alloc_conf), knobs=offers.to_dict() if offers is not None else None, versions=info.versions,
            probe_process=self.s.probe_process))

    def _changed(self, meta: StudyMeta) -> list[str]:
        """What changed since the search `meta` records (its script, its local modules)."""
        return self.version.changes(meta.script_sha256, meta.code_sha256, meta.modules)

    def _learn_modules(self, result: ProbeResult) -> None:
        """The local modules a probe loaded, kept on the study once it knows them: a later search reads them again
        to see whether they changed (their code now, as this search read it)."""
        meta = stored_meta(self.study)
        if meta is None or not result.modules or set(result.modules) <= set(meta.modules or {}):
            return
        keep_meta(self.study, replace(meta, modules=self.version.known({**(meta.modules or {}), **result.modules})))

    # --- trials -------------------------------------------------------------------------------
    def trials(self) -> list[optuna.trial.FrozenTrial]:
        """The study's trials of this search's script: a probe of another version measured another model."""
        return script_trials(self.study, self.version)

    def observations(self, exclude: int | None = None) -> list[Observation]:
        return observations(self.trials(), exclude=exclude)

    def ask(self, sampler: AutofitSampler, device: str) -> tuple[optuna.Trial, Proposal] | None:
        """A trial for the sampler's proposal, claimed for this searcher and `device`; None when another
        searcher claimed the same config first (the trial is then PRUNED as a duplicate)."""
        with quiet_heartbeat_warnings():
            trial = self.study.ask(sampler.search_space)
        self._asked.append(trial.number)
        trial.set_user_attr(SCRIPT_ATTR, self.version.sha256)  # first: another searcher's claim check reads it
        trial.set_user_attr(CODE_ATTR, self.version.code_sha256)
        trial.set_user_attr(MODULES_ATTR, self.version.known(()))  # those known: its probe adds what it loaded
        proposal = sampler.given(trial)
        if proposal is None:
            raise RuntimeError(f"trial {trial.number} was asked with nothing to probe (propose first)")
        if proposal.phase == "explore" and self._claimed_earlier(trial.number, proposal.config):
            trial.set_user_attr("duplicate", True)
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return None
        trial.set_user_attr("phase", proposal.phase)
        trial.set_user_attr("owner", {**owner_record(), "device": device})
        return trial, proposal

    def _claimed_earlier(self, number: int, config) -> bool:
        """Another process asked for the same config first (parallel workers): the lower trial
        number keeps it, so exactly one of two racing workers probes it. Optuna writes a trial's params
        just after creating it: an earlier trial created in the last CLAIM_WAIT_S and still without
        them is waited for, or both racers would keep the config (an older one was left by a searcher
        that died, and its liveness check fails it)."""
        deadline = time.monotonic() + CLAIM_WAIT_S
        while True:
            earlier = [t for t in self.trials() if t.number < number and not t.user_attrs.get("duplicate")]
            if any(_being_asked(t) for t in earlier) and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            return any(other.user_attrs.get("phase", "explore") == "explore" and trial_config(other) == config
                       and (other.state == optuna.trial.TrialState.RUNNING or "probe" in other.user_attrs)
                       for other in earlier)

    def heartbeat(self, trial: optuna.Trial) -> Heartbeat:
        """Keeps `trial` alive in the eyes of other searchers while its probe runs."""
        return Heartbeat(self.study, trial)

    def record(self, trial: optuna.Trial, result: ProbeResult, phase: str) -> None:
        if result.ok and result.flops_per_sample is None:  # compiled or sharded: the eager probes' count
            trials = self.trials()
            counted = model_flops_per_sample(trials)
            if counted is not None:
                result.set_flops(counted, peak_flops_per_s(self.device_info.name, result.config.precision),
                                 model_flops_per_token(trials))
        record_probe(self.study, trial, result, self.memory_budget.usable_bytes, phase)
        self._learn_modules(result)

    def fail_unfinished(self) -> None:
        """Ctrl-C or autofit's own failure: the trials this search asked for and never finished are FAIL,
        so their configs are probed again when the same command resumes."""
        fail_trials(self.study, self._asked)

    def check_liveness(self) -> None:
        """Every HEARTBEAT_S: fail the trials of searchers that died, so their configs are probed again
        (by anyone)."""
        if time.monotonic() >= self._next_liveness_check:
            fail_stale(self.study)
            self._next_liveness_check = time.monotonic() + HEARTBEAT_S


def _being_asked(trial: optuna.trial.FrozenTrial) -> bool:
    """Created a moment ago by a searcher that has not written all its params yet (Optuna writes them one by
    one, batch_size last: `study.distributions`), so its config cannot be read."""
    if trial.state != optuna.trial.TrialState.RUNNING or trial_config(trial) is not None or trial.datetime_start is None:
        return False
    return (datetime.now() - trial.datetime_start).total_seconds() < CLAIM_WAIT_S


def same_devices(device: str, indices: tuple[int, ...]) -> DeviceInfo:
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
