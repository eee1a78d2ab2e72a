"""autofit: find the fastest training configuration that fits your accelerator's memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autofit.config import PRECISIONS, Config
from autofit.decorator import AutofitFunction, autofit
from autofit.errors import AutofitError
from autofit.options import SearchOptions

if TYPE_CHECKING:
    from autofit.study import StoredStudy

__version__ = "0.1.0"


def load_study(name: str | None = None, storage: str | None = None) -> StoredStudy:
    """A stored study to read: `.trials_frame()`, `.best()`, `.document()`, `.meta` (see autofit.study._stored).

    Imports its dependencies (optuna, pandas) on call, so `import autofit` stays light.
    """
    from autofit.study import load_study as _load_study

    return _load_study(name, storage)


__all__ = [
    "autofit",
    "AutofitFunction",
    "SearchOptions",
    "Config",
    "PRECISIONS",
    "AutofitError",
    "load_study",
    "__version__",
]
