"""Probes and Optuna trials, both ways: a probe is stored whole on its trial (record_probe), and a
trial is read back as the Config it asked for and the ProbeResult it holds. The search writes through
this module; autofit.findings (the planner's observations), the reports and the frame read through it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from autofit.config import KNOB, KNOBS, Config
from autofit.probing import ProbeResult, RecordedVersion
from autofit.study._attributes import stored_meta

#: Errors that say the data cannot feed a batch this large (a ceiling, not a fault of the code).
DATA_BOUND_ERRORS = ("ProbeTooShort", "DataTooSmall")
#: Trial user attribute: the sha256 of the script its probe ran (its bytes). A probe of another version of the
#: script measured another model: it is kept, but nothing is ranked, implied or exported from it (`script_trials`).
SCRIPT_ATTR = "script_sha256"
#: Trial user attributes of the version a trial was asked under (absent on trials recorded before them): the
#: script's code_sha256 (its tokens: a comment changes nothing), and the code of each local module the search
#: knew of then; the probe's own record adds those its process loaded (`ProbeResult.modules`).
CODE_ATTR = "code_sha256"
MODULES_ATTR = "script_modules"
#: What a function offers for its configs to be sized by tokens (the token caps' offer).
_TOKEN_OFFER = KNOB["max_tokens"].offer
#: Probes that ran (fit or not) are COMPLETE trials: the samplers learn from OOMs too.
_COMPLETE_STATUSES = ("ok", "oom")


def distributions(batch_range: tuple[int, int], max_checkpoint: int, max_accumulation: int,
                  offered: Iterable[str] = (),
                  token_range: tuple[int, int] | None = None) -> dict[str, BaseDistribution]:
    """The trial parameters: each knob (autofit.knobs) that is `stored` (every study holds it) or the size,
    and each whose `offer` the search considers (`offered`: autofit.knobs' Offers fields; the token caps'
    with a `token_range`). Integer ranges, so a study may widen them later (Optuna allows that); the other
    knobs categorical over their values (None first where it is one: the loader as the script declares it).
    Knobs the search does not consider are no params: other studies keep their form."""
    offered = {*offered, *((_TOKEN_OFFER,) if token_range is not None else ())}
    ranges = {"batch_size": (batch_range[0], max(batch_range)), "checkpoint_segments": (0, max(0, max_checkpoint)),
              "accumulation_steps": (1, max(1, max_accumulation)),
              "max_tokens": (token_range[0], max(token_range)) if token_range else (1, 1)}
    params: dict[str, BaseDistribution] = {}
    for knob in KNOBS:
        if not knob.stored and knob.offer is not None and knob.offer not in offered:
            continue
        if knob.name in ranges:
            params[knob.name] = IntDistribution(*ranges[knob.name])
        elif knob.maximum is not None:  # a range of its own: None as its `none_param`, below its minimum
            low = knob.minimum if knob.none_param is None else min(knob.minimum, knob.none_param)
            params[knob.name] = IntDistribution(low, knob.maximum)
        else:
            params[knob.name] = CategoricalDistribution(knob.trial_values())
    # Optuna writes a new trial's params one by one in this order: batch_size last, so that a trial with it
    # holds its whole config (another searcher's claim check waits until then: search._session).
    return {**{k: v for k, v in params.items() if k != "batch_size"}, "batch_size": params["batch_size"]}


def config_params(config: Config) -> dict[str, Any]:
    """The trial parameters of a config: every knob's value (Optuna takes those it asks for), the token caps
    only by tokens (a study by samples has no such params)."""
    return {knob.name: knob.param(getattr(config, knob.name)) for knob in KNOBS
            if knob.offer != _TOKEN_OFFER or config.max_tokens is not None}


def trial_config(trial: FrozenTrial) -> Config | None:
    return Config.from_dict(trial.params) if "batch_size" in trial.params else None


def trial_result(trial: FrozenTrial) -> ProbeResult | None:
    data = trial.user_attrs.get("probe")
    return ProbeResult.from_dict(data) if data else None


def script_trials(study: optuna.Study, version: str | RecordedVersion | None = None) -> list[FrozenTrial]:
    """The study's trials of one version of its script: `version` (a search's `ScriptVersion`, which reads the
    files now; a sha256 of the script's bytes), or the one its latest search ran (as its settings record it).
    A trial is of that version when its script and every local module its probe loaded are (see
    `RecordedVersion.changes`: a comment changes nothing; what neither records is not known, and not counted).
    A trial recorded before trials carried their script counts as the study's script then
    (`StudyMeta.unstamped_script`), one running without it as `version` (its searcher stamps it just after
    asking for it), and one whose script is unknown (a study from before the hash was kept) as any."""
    return _by_script(study, version)[0]


def other_script_probes(study: optuna.Study, version: str | RecordedVersion | None = None) -> int:
    """How many of the study's probes ran another version of the script than `script_trials`'."""
    return sum(trial_result(t) is not None for t in _by_script(study, version)[1])


def script_changes(study: optuna.Study, version: str | RecordedVersion | None = None) -> list[str]:
    """What changed between the probes of other versions and `version`: the script's name, the local modules'
    paths, in order, each once (empty: no probe of another version)."""
    version, unstamped = _version(study, version)
    changed: dict[str, None] = {}
    for trial in _by_script(study, version)[1]:
        changed.update(dict.fromkeys(version.changes(*_stamps(trial, unstamped))))
    return list(changed)


def _version(study: optuna.Study, version: str | RecordedVersion | None) -> tuple[RecordedVersion | None, str | None]:
    """The version trials are compared with (None: none known, every trial is of it), and the sha256 of the
    script of the trials that carry none."""
    meta = stored_meta(study)
    if version is None and meta is not None and (meta.script_sha256 or meta.code_sha256):
        version = RecordedVersion(sha256=meta.script_sha256, code_sha256=meta.code_sha256, modules=meta.modules or {})
    elif isinstance(version, str):
        version = RecordedVersion(sha256=version)
    return version, meta.unstamped_script if meta else None


def _stamps(trial: FrozenTrial, unstamped: str | None) -> tuple[str | None, str | None, dict[str, str]]:
    """The version a trial ran (sha256, code_sha256, its local modules): the one it was stamped with, and the
    modules its probe loaded; a trial still running unstamped ran the asker's (nothing here to differ)."""
    attrs = trial.user_attrs
    running = trial.state == TrialState.RUNNING and SCRIPT_ATTR not in attrs
    probed = (attrs.get("probe") or {}).get("modules") or {}  # ProbeResult.modules, read without the whole record
    modules = {**(attrs.get(MODULES_ATTR) or {}), **probed}
    return (None if running else attrs.get(SCRIPT_ATTR, unstamped)), attrs.get(CODE_ATTR), modules


def _by_script(study: optuna.Study, version: str | RecordedVersion | None) -> tuple[list[FrozenTrial], list[FrozenTrial]]:
    """The study's trials of `version` (default: the study's), and the others."""
    trials = study.get_trials(deepcopy=False)
    version, unstamped = _version(study, version)
    if version is None:
        return trials, []
    same = [not version.changes(*_stamps(t, unstamped)) for t in trials]
    return [t for t, s in zip(trials, same) if s], [t for t, s in zip(trials, same) if not s]


def model_flops_per_sample(trials: list[FrozenTrial]) -> float | None:
    """The function's model FLOPs per sample as its probes counted them (the median: the count does
    not depend on the config, and compiled or sharded probes count none), None before any count."""
    return _median_count(trials, "flops_per_sample")


def model_flops_per_token(trials: list[FrozenTrial]) -> float | None:
    """The function's model FLOPs per real token as its probes counted them (the median), None where none
    counted tokens."""
    return _median_count(trials, "flops_per_token")


def _median_count(trials: list[FrozenTrial], name: str) -> float | None:
    """The median of a FLOP count the probes recorded (`name` of ProbeResult), None where none did."""
    counted = sorted(value for t in trials if (r := trial_result(t)) and (value := getattr(r, name)))
    return counted[len(counted) // 2] if counted else None


def record_probe(study: optuna.Study, trial: optuna.Trial, result: ProbeResult, usable_bytes: float, phase: str) -> FrozenTrial:
    """Store the whole probe on its trial; OOM and over-headroom are infeasible COMPLETE trials."""
    trial.set_user_attr("probe", result.to_dict())
    trial.set_user_attr("phase", phase)
    trial.set_user_attr("status", result.status)
    if result.status in _COMPLETE_STATUSES:
        if result.status == "oom":
            violation = max(1.0, float(result.memory_limit or usable_bytes) - usable_bytes)
        else:
            violation = float(result.peak_bytes or 0) - usable_bytes
        trial.set_constraint("memory", violation)
        return study.tell(trial, result.rate or 0.0)
    return study.tell(trial, state=TrialState.FAIL)
