"""Opening a study for a search: a new one, or one to resume. Resuming is allowed only on the same
device, limit and headroom (the probes would not compare otherwise); the trials of a searcher that
died are failed so their configs are probed again; a changed script (its code, or a local module it imports:
a comment changes nothing) is pointed out, naming the files that changed (its earlier probes are kept, but only
those of the script searched now are ranked: autofit.study's `script_trials`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import optuna

from autofit.errors import UsageError
from autofit.export import MemoryBudget
from autofit.probing import RecordedVersion
from autofit.search._liveness import fail_stale
from autofit.study import forget_script, other_script_probes, script_changes, stored_meta
from autofit.units import format_size


@dataclass
class OpenedStudy:
    study: optuna.Study
    memory_budget: MemoryBudget
    """The memory to search under: the study's own limit when it resumes with a defaulted limit."""
    notes: list[str] = field(default_factory=list)
    created: bool = False
    """No study of this name was in the storage before: this search made it (Session.discard_if_unused)."""


def open_study(storage: optuna.storages.BaseStorage, name: str, *, fresh: bool, device_name: str,
               budget: MemoryBudget, limit_given: bool, version: RecordedVersion | None,
               world_size: int = 1, script_args: list[str] | None = None) -> OpenedStudy:
    """The study to search in, checked against what this search runs under (UsageError if it differs).
    `version`: the script as this search runs it (its code and its local modules': autofit.probing's
    `ScriptVersion`); a resumed study's probes of another version are pointed out, naming what changed."""
    created = not study_exists(storage, name)
    if fresh:
        try:
            optuna.delete_study(study_name=name, storage=storage)
        except KeyError:
            pass
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)
    opened = OpenedStudy(study, budget, created=created)
    meta = stored_meta(study)
    if meta is not None:
        if not limit_given and not meta.limit_given:
            # No --memory-limit, then or now: the limit was the memory free when the study began
            # (it changes every run); resume with that one.
            opened.memory_budget = MemoryBudget.of(int(meta.memory.limit_bytes), budget.headroom)
        limit = _LimitWords(meta.limit_given, limit_given, meta.device_info.get("type"))
        checks = (("device", meta.device_info.get("name"), device_name, str, str),
                  ("memory limit", meta.memory.limit_bytes, opened.memory_budget.limit_bytes, limit.kept, limit.given),
                  ("headroom", meta.memory.headroom, budget.headroom, _headroom, _headroom),
                  ("ranks per probe", meta.world_size, world_size, _ranks, str),
                  ("script arguments", list(meta.script_args), script_args or [], _args, _args))
        for what, kept, value, kept_words, given_words in checks:
            if kept != value:
                raise UsageError(
                    f"The study {name} must be resumed with the same {what} ({kept_words(kept)}), but got "
                    f"{given_words(value)}: search with the same {what} to resume it, pass --fresh to start over or "
                    f"--study to name another."
                )
        if version is not None and version.changes(meta.script_sha256, meta.code_sha256, meta.modules):
            forget_script(study)  # the knobs and memory estimates were the other version's
        others = other_script_probes(study, version)
        if others:
            opened.notes.append(f"the script changed ({', '.join(script_changes(study, version))}): {others} of this "
                                f"study's probes ran another version of it; they are kept but not ranked, and their "
                                f"configs are probed again (--fresh drops them)")
    stale = fail_stale(study)
    if stale:
        opened.notes.append(f"trials {', '.join(map(str, stale))} were left running by a searcher that died "
                            f"(killed, or out of memory); their configs are probed again")
    return opened


def study_exists(storage: optuna.storages.BaseStorage, name: str) -> bool:
    try:
        storage.get_study_id_from_name(name)
    except KeyError:
        return False
    return True


def fail_trials(study: optuna.Study, numbers: list[int]) -> None:
    """Trials this process asked for and never finished (Ctrl-C, an error of autofit's own) are FAIL,
    never left RUNNING, so their configs are probed again on resume."""
    for number in numbers:
        try:
            study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        except Exception:  # noqa: BLE001 - already finished or removed: nothing to do
            continue


def _args(args: list[str]) -> str:
    return f"after --: {' '.join(args)}" if args else "none"


def _headroom(headroom: float) -> str:
    return f"--headroom {headroom:g}"


def _ranks(world_size: int) -> str:
    return f"{world_size}: --nproc-per-node x --nnodes"


@dataclass(frozen=True)
class _LimitWords:
    """A resumed study's memory limit and the one asked now, in the option's words and units: a search that
    gave no --memory-limit searched under the device's memory (on the CPU, what was free when it began)."""

    kept_given: bool
    now_given: bool
    device_type: str | None

    def _none(self, limit: int, when: str) -> str:
        memory = f"the {format_size(limit)} free {when}" if self.device_type == "cpu" else \
            f"the device's {format_size(limit)}"
        return f"none given, so {memory}"

    def kept(self, limit: int) -> str:
        return f"--memory-limit {format_size(limit)}" if self.kept_given else self._none(limit, "when it began")

    def given(self, limit: int) -> str:
        return f"--memory-limit {format_size(limit)}" if self.now_given else self._none(limit, "now")
