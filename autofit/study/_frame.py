"""A study as a pandas DataFrame, one row per probe: what the CLI table, reports and notebook share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from optuna.trial import FrozenTrial

from autofit.config import KNOBS
from autofit.study._trials import trial_config, trial_result

if TYPE_CHECKING:
    import pandas as pd

#: The columns and their dtypes: the probe's, a column per knob (autofit.knobs), then what it measured.
COLUMNS = {
    "trial": "int64", "phase": "string", "status": "string", "label": "string",
    **{knob.name: knob.frame_dtype for knob in KNOBS},
    "global_batch": "int64", "samples_per_s": "float64", "tokens_per_s": "float64",
    "flops_per_s": "float64", "mfu": "float64", "joules_per_sample": "float64",
    "step_time_median_s": "float64", "peak_bytes": "Int64", "limit_bytes": "Int64",
    "usable_bytes": "Int64", "peak_fraction": "float64", "feasible": "boolean", "wall_s": "float64",
    "start_s": "float64", "compile_s": "float64", "probe_accumulation": "Int64",
    "error": "string", "log_path": "string", "started": "datetime64[ns]",
}


def trials_frame(trials: list[FrozenTrial], usable_bytes: float | None) -> pd.DataFrame:
    """Probes of a study with typed columns (see COLUMNS); trials without a probe are left out."""
    import pandas as pd  # imported here: reading or searching a study never needs pandas otherwise

    rows = []
    for trial in trials:
        config, result = trial_config(trial), trial_result(trial)
        if config is None or result is None:
            continue
        feasible = result.status == "ok" and (
            usable_bytes is None or result.peak_bytes is None or result.peak_bytes <= usable_bytes
        )
        rows.append({
            "trial": trial.number,
            "phase": trial.user_attrs.get("phase", "explore"),
            "status": result.status,
            "label": config.label(),  # every knob: the one name of a config in every table and plot
            **{knob.name: getattr(config, knob.name) for knob in KNOBS},
            "global_batch": config.global_batch,
            "samples_per_s": result.samples_per_s,
            "tokens_per_s": result.tokens_per_s,
            "flops_per_s": result.flops_per_s,
            "mfu": result.mfu,
            "joules_per_sample": result.joules_per_sample,
            "step_time_median_s": result.step_time_median_s,
            "peak_bytes": result.peak_bytes,
            "limit_bytes": result.memory_limit,
            "usable_bytes": int(usable_bytes) if usable_bytes else None,
            "peak_fraction": (result.peak_bytes / result.memory_limit) if result.peak_bytes and result.memory_limit else None,
            "feasible": feasible,
            "wall_s": result.wall_s,
            "start_s": result.start_s,
            "compile_s": result.compile_s,
            "probe_accumulation": result.probe_accumulation,
            "error": (f"{result.error_type}: {result.error_message.splitlines()[0]}" if result.error_message else None),
            "log_path": result.log_path,
            "started": trial.datetime_start,
        })
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    return frame.astype(COLUMNS)
