"""A forecast's input: a best-config file (any written with schema 1, before forecasts too), or a study."""

from __future__ import annotations

import os
from typing import Any

from autofit.errors import UsageError
from autofit.export import read_best
from autofit.forecast._source import Measured, per_sample_bytes


def _plain(value: Any) -> Any:
    """A frame's cell as plain Python (pandas' NA and NaN as None)."""
    if isinstance(value, float) and value != value:
        return None
    if type(value).__name__ in ("NAType", "NaTType"):
        return None
    return value.item() if hasattr(value, "item") else value


def forecast_input(file_or_study: str, storage: str | None = None) -> Measured:
    """What a forecast starts from: a path that exists is a best-config file; anything else a study's name
    in `storage` (autofit show's default storage)."""
    if os.path.isdir(file_or_study):
        found = sorted(name for name in os.listdir(file_or_study) if name.endswith(".best.json"))
        hint = f": one of its best-config files ({', '.join(found[:3])})" if found else ""
        raise UsageError(f"A forecast reads a best-config file or a study's name, but {file_or_study} is a "
                         f"directory{hint}.")
    if os.path.exists(file_or_study) or file_or_study.endswith(".json"):
        return Measured(read_best(file_or_study), source=file_or_study)
    from autofit.findings import load_study

    return study_input(load_study(file_or_study, storage))


def study_input(stored: Any) -> Measured:
    """A stored study's best-config record, its probes that ran, as plain rows, and the memory
    estimator's bytes per sample at the peak factors of the device its probes ran on (their peaks carry that
    device's overheads: a CPU's heap) (NoFeasibleConfig when nothing fits)."""
    from autofit.memory import peak_factors

    frame = stored.trials_frame()
    rows = [{k: _plain(v) for k, v in row.items()} for row in frame[frame["status"] == "ok"].to_dict("records")]
    estimates = stored.estimates
    factors = peak_factors(stored.meta.device_info.get("type", "cpu"))["factors"]
    slopes = per_sample_bytes(estimates.breakdowns, factors) if estimates else {}
    return Measured(stored.document(), rows, slopes, f"study {stored.name}")
