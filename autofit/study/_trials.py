"""Probes and Optuna trials, both ways: a probe is stored whole on its trial (record_probe), and a
trial is read back as the Config it asked for and the ProbeResult it holds. The search writes through
this module; autofit.findings (the planner's observations), the reports and the frame read through it."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from autofit.config import (
    CHECKPOINT_POLICIES,
    LOADER_FIELDS,
    LOADER_PREFETCH,
    LOADER_WORKERS,
    PRECISIONS,
    SHARDINGS,
    Config,
)
from autofit.probing import ProbeResult

#: Errors that say the data cannot feed a batch this large (a ceiling, not a fault of the code).
DATA_BOUND_ERRORS = ("ProbeTooShort", "DataTooSmall")
#: Probes that ran (fit or not) are COMPLETE trials: the samplers learn from OOMs too.
_COMPLETE_STATUSES = ("ok", "oom")
#: The largest squares cap a trial may hold (Optuna keeps integers as floats: exact below 2**53).
MAX_SQUARES = 2**50


def distributions(batch_range: tuple[int, int], max_checkpoint: int, max_accumulation: int,
                  sharded: bool = False, compiled: bool = False, loader: bool = False,
                  selective: bool = False, token_range: tuple[int, int] | None = None) -> dict[str, BaseDistribution]:
    """The trial parameters. Integer ranges, so a study may widen them later (Optuna allows that).
    `sharding`, `compile`, the loader's fields and `checkpoint_policy` only where the search considers
    them: other studies keep their form. The loader's choices include None: the loader as the script
    declares it. `max_tokens` (within `token_range`) and `max_squares` (0: none) only for a function that
    batches by tokens."""
    return {
        "batch_size": IntDistribution(batch_range[0], max(batch_range[0], batch_range[1])),
        "precision": CategoricalDistribution(PRECISIONS),
        "checkpoint_segments": IntDistribution(0, max(0, max_checkpoint)),
        "accumulation_steps": IntDistribution(1, max(1, max_accumulation)),
        **({"sharding": CategoricalDistribution(SHARDINGS)} if sharded else {}),
        **({"compile": CategoricalDistribution((False, True))} if compiled else {}),
        **({"loader_workers": CategoricalDistribution((None, *LOADER_WORKERS)),
            "pin_memory": CategoricalDistribution((None, False, True)),
            "prefetch_factor": CategoricalDistribution((None, *LOADER_PREFETCH))} if loader else {}),
        **({"checkpoint_policy": CategoricalDistribution(CHECKPOINT_POLICIES)} if selective else {}),
        **({"max_tokens": IntDistribution(token_range[0], max(token_range)),
            "max_squares": IntDistribution(0, MAX_SQUARES)} if token_range else {}),
    }


def config_params(config: Config) -> dict[str, Any]:
    """The trial parameters of a config: the config's own fields (Optuna takes those it asks for)."""
    return {**config.to_dict(), "sharding": config.sharding, "compile": config.compile,
            **{name: getattr(config, name) for name in LOADER_FIELDS},
            "checkpoint_policy": config.checkpoint_policy,
            **({"max_squares": config.max_squares or 0} if config.max_tokens is not None else {})}


def trial_config(trial: FrozenTrial) -> Config | None:
    return Config.from_dict(trial.params) if "batch_size" in trial.params else None


def trial_result(trial: FrozenTrial) -> ProbeResult | None:
    data = trial.user_attrs.get("probe")
    return ProbeResult.from_dict(data) if data else None


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
