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
from autofit.probing import ProbeResult
from autofit.study._attributes import stored_meta

#: Errors that say the data cannot feed a batch this large (a ceiling, not a fault of the code).
DATA_BOUND_ERRORS = ("ProbeTooShort", "DataTooSmall")
#: Trial user attribute: the sha256 of the script its probe ran. A probe of another version of the script
#: measured another model: it is kept, but nothing is ranked, implied or exported from it (`script_trials`).
SCRIPT_ATTR = "script_sha256"
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


def script_trials(study: optuna.Study, sha256: str | None = None) -> list[FrozenTrial]:
    """The study's trials of one version of its script: `sha256`, or the one its latest search ran. A trial
    recorded before trials carried their script counts as the study's script then (`StudyMeta.unstamped_script`),
    one running without it as `sha256` (its searcher stamps it just after asking for it), and one whose script is
    unknown (a study from before the hash was kept) as any."""
    return _by_script(study, sha256)[0]


def other_script_probes(study: optuna.Study, sha256: str | None = None) -> int:
    """How many of the study's probes ran another version of the script than `script_trials`'."""
    return sum(trial_result(t) is not None for t in _by_script(study, sha256)[1])


def _by_script(study: optuna.Study, sha256: str | None) -> tuple[list[FrozenTrial], list[FrozenTrial]]:
    """The study's trials of the script `sha256` (default: the study's), and the others."""
    trials = study.get_trials(deepcopy=False)
    meta = stored_meta(study)
    sha256 = sha256 or (meta.script_sha256 if meta else None)
    unstamped = meta.unstamped_script if meta else None
    if sha256 is None:
        return trials, []
    ran = [t.user_attrs.get(SCRIPT_ATTR, sha256 if t.state == TrialState.RUNNING else unstamped) for t in trials]
    return ([t for t, h in zip(trials, ran) if h in (None, sha256)],
            [t for t, h in zip(trials, ran) if h not in (None, sha256)])


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
