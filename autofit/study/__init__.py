"""A search's record, stored and read back as raw data: Optuna storages opened for writing
(`open_storage`) and reading (`open_for_reading`, `locate`), their URLs as they may be shown
(`redacted`), probes stored on trials and read back (`record_probe`, `trial_result`; `script_trials`,
those of one version of the script), the probes as a DataFrame (`trials_frame`), and what the search
keeps beside its trials (`study_meta`, `record_end`, `kept_estimates`). What the probes say (the
ranking, the best-config document, why the winner won) is autofit.findings'."""

from __future__ import annotations

from autofit.study._attributes import (
    END_ATTR,
    ESTIMATES_ATTR,
    StudyMeta,
    forget_script,
    keep_estimates,
    keep_meta,
    kept_estimates,
    record_end,
    recorded_end,
    stored_meta,
    study_meta,
)
from autofit.study._frame import COLUMNS, trials_frame
from autofit.study._locate import Located, bundled_storage_url, locate, locate_storage
from autofit.study._storage import (
    HEARTBEAT_S,
    STALE_AFTER_S,
    default_storage_url,
    default_study_name,
    engine_url,
    is_journal,
    open_for_reading,
    open_storage,
    quiet_heartbeat_warnings,
    redacted,
    scrubbed,
    storage_exists,
    storage_file,
    storage_label,
)
from autofit.study._trials import (
    DATA_BOUND_ERRORS,
    SCRIPT_ATTR,
    config_params,
    distributions,
    model_flops_per_sample,
    model_flops_per_token,
    other_script_probes,
    record_probe,
    script_trials,
    trial_config,
    trial_result,
)

__all__ = [
    "COLUMNS",
    "DATA_BOUND_ERRORS",
    "END_ATTR",
    "ESTIMATES_ATTR",
    "HEARTBEAT_S",
    "SCRIPT_ATTR",
    "STALE_AFTER_S",
    "Located",
    "bundled_storage_url",
    "config_params",
    "default_storage_url",
    "default_study_name",
    "distributions",
    "engine_url",
    "forget_script",
    "is_journal",
    "keep_estimates",
    "kept_estimates",
    "locate",
    "locate_storage",
    "model_flops_per_sample",
    "model_flops_per_token",
    "open_for_reading",
    "open_storage",
    "other_script_probes",
    "quiet_heartbeat_warnings",
    "record_end",
    "record_probe",
    "recorded_end",
    "redacted",
    "script_trials",
    "scrubbed",
    "storage_exists",
    "storage_file",
    "storage_label",
    "study_meta",
    "StudyMeta",
    "keep_meta",
    "stored_meta",
    "trial_config",
    "trial_result",
    "trials_frame",
]
