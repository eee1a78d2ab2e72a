"""autofit: find the fastest training configuration that fits your accelerator's memory."""

from autofit.api import AutofitFunction, SearchOptions, autofit
from autofit.errors import AutofitError
from autofit.space import PRECISIONS, Config

__version__ = "0.1.0"

__all__ = [
    "autofit",
    "AutofitFunction",
    "SearchOptions",
    "Config",
    "PRECISIONS",
    "AutofitError",
    "__version__",
]
