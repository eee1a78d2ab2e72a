"""A search's record: Optuna storages opened for writing (`open_storage`) and reading
(`load_study`, `StoredStudy`), probes stored on trials and read back (`record_probe`,
`observations`), the study as a DataFrame, why the winner won, and the best-config document built
from a study (`best_document`; the file it is written to is autofit.export)."""

from __future__ import annotations

from autofit.study._document import END_ATTR, best_document, record_end, study_meta, study_planner
from autofit.study._estimates import ESTIMATES_ATTR, StoredEstimates, stored_estimates
from autofit.study._explain import explain, fault_notes, nothing_fits
from autofit.study._frame import COLUMNS, trials_frame
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
from autofit.study._stored import (
    Located,
    StoredStudy,
    bundled_storage_url,
    list_studies,
    load_study,
    locate,
)
from autofit.study._trials import (
    DATA_BOUND_ERRORS,
    config_params,
    distributions,
    model_flops_per_sample,
    observations,
    record_probe,
    trial_config,
    trial_result,
)

__all__ = [
    "COLUMNS",
    "DATA_BOUND_ERRORS",
    "END_ATTR",
    "ESTIMATES_ATTR",
    "HEARTBEAT_S",
    "STALE_AFTER_S",
    "Located",
    "StoredEstimates",
    "StoredStudy",
    "best_document",
    "bundled_storage_url",
    "config_params",
    "default_storage_url",
    "default_study_name",
    "distributions",
    "model_flops_per_sample",
    "engine_url",
    "is_journal",
    "explain",
    "fault_notes",
    "list_studies",
    "load_study",
    "locate",
    "nothing_fits",
    "observations",
    "open_for_reading",
    "open_storage",
    "quiet_heartbeat_warnings",
    "record_end",
    "record_probe",
    "redacted",
    "scrubbed",
    "storage_exists",
    "storage_file",
    "storage_label",
    "stored_estimates",
    "study_meta",
    "study_planner",
    "trial_config",
    "trial_result",
    "trials_frame",
]
