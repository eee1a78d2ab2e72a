"""What a search keeps on its study beside the trials, as raw data: its settings (the "autofit" user
attribute), how it ended, and the memory estimator's answers. Written by the search, read by everything
that interprets a stored study (autofit.findings, autofit.memory's `stored_estimates`)."""

from __future__ import annotations

from typing import Any

import optuna

from autofit.errors import UsageError

#: Study user attribute where the search records how it ended ({"stopped": ..., "partial": ...}).
END_ATTR = "autofit_end"
#: Study user attribute holding the memory estimator's answers (autofit.memory's StoredEstimates).
ESTIMATES_ATTR = "autofit_estimates"


def study_meta(study: optuna.Study) -> dict[str, Any]:
    """The search's settings stored on the study; a study autofit did not write has none."""
    meta = study.user_attrs.get("autofit")
    if not meta or "space" not in meta:
        raise UsageError(f"The study must have been written by `autofit search`, but {study.study_name} "
                         f"has no autofit settings (no probe was recorded).")
    return meta


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
