"""A stored study as the planner sees it: its trials read as the planner's Observations, and the
planner rebuilt over the study's own search space, usable memory and memory estimates, so a stored
study ranks and explains exactly as the search that wrote it did."""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

from autofit.memory import stored_estimates
from autofit.planner import Observation, Planner, SearchSpace
from autofit.probing import BUDGET_CUT, TIMEOUT_TYPES
from autofit.study import DATA_BOUND_ERRORS, study_meta, trial_config, trial_result


def observations(trials: list[FrozenTrial], exclude: int | None = None) -> list[Observation]:
    """What the planner may know: finished probes, and configs other workers are probing now."""
    out = []
    for trial in trials:
        if trial.number == exclude or trial.user_attrs.get("duplicate"):
            continue
        config = trial_config(trial)
        if config is None:
            continue
        if trial.state == TrialState.RUNNING:
            out.append(Observation(config, "running", phase=trial.user_attrs.get("phase", "explore")))
            continue
        result = trial_result(trial)
        if result is None:
            continue  # interrupted before it measured anything: probe it again
        spread = (result.step_time_iqr_s / result.step_time_median_s
                  if result.step_time_iqr_s is not None and result.step_time_median_s else None)
        out.append(Observation(config, result.status, result.peak_bytes, result.rate,
                               result.wall_s, trial.user_attrs.get("phase", "explore"), spread,
                               result.only_just_fits, result.error_type in DATA_BOUND_ERRORS,
                               result.data_wait_share, trial.number, start_s=result.start_s,
                               step_s=result.probe_step_s or result.step_time_median_s,
                               ran_accumulation=result.probe_accumulation, cut=result.error_type == BUDGET_CUT,
                               stalled=result.error_type == TIMEOUT_TYPES["stall"]))
    return out


def study_planner(study: optuna.Study) -> Planner:
    """The planner over the study's own search space, usable memory and memory estimates, as the
    search ranked and explained with."""
    meta = study_meta(study)
    estimates = stored_estimates(study)
    device = meta.device_info.get("type", "cpu")
    return Planner(SearchSpace.from_dict(meta.space), meta.memory.usable_bytes,
                   prediction=estimates.prediction(device) if estimates else None)
