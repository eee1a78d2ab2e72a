"""A forecast's input: a best-config file (any written with schema 1, before forecasts too), or a study."""

from __future__ import annotations

import os
from typing import Any

from autofit.export import read_best


def _plain(value: Any) -> Any:
    """A frame's cell as plain Python (pandas' NA and NaN as None)."""
    if isinstance(value, float) and value != value:
        return None
    if type(value).__name__ in ("NAType", "NaTType"):
        return None
    return value.item() if hasattr(value, "item") else value


def forecast_input(file_or_study: str, storage: str | None = None) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """The best-config document, a study's probes that ran (none for a file), and what was read: a path
    that exists is a file; anything else a study's name in `storage` (autofit show's default storage)."""
    if os.path.exists(file_or_study) or file_or_study.endswith(".json"):
        return read_best(file_or_study).document, [], file_or_study
    from autofit.findings import load_study

    stored = load_study(file_or_study, storage)
    document, rows = study_input(stored)
    return document, rows, f"study {stored.name}"


def study_input(stored: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A stored study's best-config document and its probes that ran, as plain rows (NoFeasibleConfig
    when nothing fits)."""
    frame = stored.trials_frame()
    rows = [{k: _plain(v) for k, v in row.items()} for row in frame[frame["status"] == "ok"].to_dict("records")]
    return stored.document(), rows
