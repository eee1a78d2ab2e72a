"""The search from Python: `run_search(settings)` and the decorator's `train.search(...)`."""

from __future__ import annotations

from typing import Any

from autofit.search._loop import Search
from autofit.search._progress import Reporter
from autofit.search._settings import SearchResult, SearchSettings


def run_search(settings: SearchSettings, reporter: Reporter | None = None) -> SearchResult:
    """Search the best config for `settings.script`; see SearchSettings for the knobs."""
    return Search(settings, reporter or Reporter(quiet=True)).run()


def search_function(fn: Any, **kwargs: Any) -> SearchResult:
    """`train.search(budget="20m", memory_limit="2GiB", ...)` from Python."""
    import inspect

    from autofit.units import parse_duration, parse_size

    if "budget" in kwargs:
        kwargs["budget_s"] = parse_duration(kwargs.pop("budget"))
    if isinstance(kwargs.get("memory_limit"), str):
        kwargs["memory_limit"] = parse_size(kwargs["memory_limit"])
    reporter = kwargs.pop("reporter", None)
    script = inspect.getsourcefile(fn.fn)
    return run_search(SearchSettings(script=script, function=fn.fn.__name__, **kwargs), reporter)
