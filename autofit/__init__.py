"""autofit: find the fastest training configuration that fits your accelerator's memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autofit._version import __version__
from autofit.config import PRECISIONS, Config
from autofit.decorator import AutofitFunction, autofit
from autofit.errors import AutofitError
from autofit.options import SearchOptions
from autofit.script_run import start

if TYPE_CHECKING:
    from autofit.findings import StoredStudy


def load_study(name: str | None = None, storage: str | None = None) -> StoredStudy:
    """A stored study to read: `.trials_frame()`, `.best()`, `.document()`, `.meta` (see autofit.findings.StoredStudy).

    Imports its dependencies (optuna, pandas) on call, so `import autofit` stays light.
    """
    from autofit.findings import load_study as _load_study

    return _load_study(name, storage)


__all__ = [
    "autofit",
    "start",
    "AutofitFunction",
    "SearchOptions",
    "Config",
    "PRECISIONS",
    "AutofitError",
    "load_study",
    "__version__",
]
