"""What a search keeps on its study beside the trials, as raw data: its settings (StudyMeta, the STUDY_ATTR user
attribute), how it ended, and the memory estimator's answers. Written by the search, read by everything
that interprets a stored study (autofit.findings, autofit.memory's `stored_estimates`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import optuna

from autofit.errors import UsageError
from autofit.export import STUDY_ATTR, MemoryBudget

#: Study user attribute where the search records how it ended ({"stopped": ..., "partial": ...}).
END_ATTR = "autofit_end"
#: Study user attribute holding the memory estimator's answers (autofit.memory's StoredEstimates).
ESTIMATES_ATTR = "autofit_estimates"


@dataclass(frozen=True, kw_only=True)
class StudyMeta:
    """The search's settings as its study keeps them (the STUDY_ATTR user attribute): written once the search
    knows its space (`keep_meta`), read by everything that interprets the study (`study_meta`). A study
    recorded before a setting was kept reads with that setting's default."""

    script: str
    function: str | None = None
    device_info: dict[str, Any] = field(default_factory=dict)
    """The device as `autofit devices` describes it (`type`, `name`, ...)."""
    memory: MemoryBudget
    limit_given: bool = True
    """Whether --memory-limit set the limit (else it was the memory free when the study began)."""
    script_sha256: str | None = None
    """The script its latest search ran: the one its probes are ranked and exported for (see `script_trials`)."""
    unstamped_sha256: str | None = None
    """The script of the probes that carry none (recorded before each probe kept its own): the study's script
    when a search first rewrote these settings (`keep_meta` keeps it from then on; None: as `script_sha256`)."""
    code_sha256: str | None = None
    """The code of the script its latest search ran (its tokens: autofit.probing's `code_sha256`; None: a study
    from before it was kept, compared by `script_sha256` alone)."""
    modules: dict[str, str] | None = None
    """The code of each local module its latest search's probes loaded, by path from the project's root (None:
    a study from before they were kept)."""
    script_args: tuple[str, ...] = ()
    space: dict[str, Any]
    """The search space (autofit.planner's SearchSpace.to_dict)."""
    world_size: int = 1
    allocator: dict[str, Any] | None = None
    knobs: dict[str, Any] | None = None
    """The knobs the function offers, once a probe reported them."""
    versions: dict[str, Any] = field(default_factory=dict)
    probe_process: str | None = None

    @property
    def unstamped_script(self) -> str | None:
        """The sha256 a probe that carries none ran under."""
        return self.unstamped_sha256 or self.script_sha256

    @property
    def device_name(self) -> str:
        return str(self.device_info.get("name") or self.device_info.get("type") or "?")

    def to_dict(self) -> dict[str, Any]:
        """The stored form (flat: the memory budget's three keys beside the others, as every study keeps it)."""
        return {"script": self.script, "function": self.function, "device": self.device_info.get("name"),
                "device_info": self.device_info, **self.memory.to_dict(), "limit_given": self.limit_given,
                "script_sha256": self.script_sha256, "unstamped_sha256": self.unstamped_sha256,
                "code_sha256": self.code_sha256, "modules": self.modules,
                "script_args": list(self.script_args), "space": self.space,
                "world_size": self.world_size, "allocator": self.allocator, "knobs": self.knobs,
                "versions": self.versions, "probe_process": self.probe_process}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudyMeta:
        info = data.get("device_info") or ({"name": data["device"]} if data.get("device") else {})
        return cls(script=data["script"], function=data.get("function"), device_info=info,
                   memory=MemoryBudget.from_dict(data), limit_given=bool(data.get("limit_given", True)),
                   script_sha256=data.get("script_sha256"), unstamped_sha256=data.get("unstamped_sha256"),
                   code_sha256=data.get("code_sha256"), modules=data.get("modules"),
                   script_args=tuple(data.get("script_args") or ()),
                   space=data["space"], world_size=int(data.get("world_size") or 1), allocator=data.get("allocator"),
                   knobs=data.get("knobs"), versions=data.get("versions") or {},
                   probe_process=data.get("probe_process"))


def study_meta(study: optuna.Study) -> StudyMeta:
    """The search's settings stored on the study; a study autofit did not write has none."""
    meta = stored_meta(study)
    if meta is None:
        raise UsageError(f"The study must have been written by `autofit search`, but {study.study_name} "
                         f"has no autofit settings (no probe was recorded).")
    return meta


def stored_meta(study: optuna.Study) -> StudyMeta | None:
    """The settings a study keeps, None before a search wrote them (a new study, or one another searcher
    has just created)."""
    meta = study.user_attrs.get(STUDY_ATTR)
    return StudyMeta.from_dict(meta) if meta and "space" in meta else None


def keep_meta(study: optuna.Study, meta: StudyMeta) -> None:
    """Write the settings; the probes that carry no script hash keep the one they were recorded under,
    whatever script the new settings name."""
    kept = stored_meta(study)
    if kept is not None and meta.unstamped_sha256 is None:
        meta = replace(meta, unstamped_sha256=kept.unstamped_script)
    study.set_user_attr(STUDY_ATTR, meta.to_dict())


def forget_script(study: optuna.Study) -> None:
    """Drop what the study learnt of its script beside the probes (the knobs its function offers, the memory
    estimator's answers): a search of another version of the script learns them again, from its own first
    probe and its own estimator."""
    meta = stored_meta(study)
    if meta is not None and meta.knobs is not None:
        keep_meta(study, replace(meta, knobs=None))
    if kept_estimates(study) is not None:
        study.set_user_attr(ESTIMATES_ATTR, None)


def record_end(study: optuna.Study, stopped: str, partial: bool) -> None:
    """Remember why the search stopped, so a later export writes the same document."""
    study.set_user_attr(END_ATTR, {"stopped": stopped, "partial": partial})


def recorded_end(study: optuna.Study) -> dict[str, Any]:
    """How the search ended ({"stopped": ..., "partial": ...}); empty when nothing recorded its end."""
    return study.user_attrs.get(END_ATTR) or {}


def keep_estimates(study: optuna.Study, data: dict[str, Any]) -> None:
    """Keep the memory estimator's answers (StoredEstimates.to_dict) on the study."""
    study.set_user_attr(ESTIMATES_ATTR, data)


def kept_estimates(study: optuna.Study) -> dict[str, Any] | None:
    """The memory estimator's answers as the study keeps them; None when it kept none."""
    return study.user_attrs.get(ESTIMATES_ATTR) or None
