"""The search from Python: `run_search(settings)` and the decorator's `train.search(...)`."""

from __future__ import annotations

from typing import Any

from autofit.search._loop import Search
from autofit.search._progress import Reporter
from autofit.search._session import Session
from autofit.search._settings import SearchResult, SearchSettings


def run_search(settings: SearchSettings, reporter: Reporter | None = None) -> SearchResult:
    """Search the best config for `settings.script`; see SearchSettings for the knobs."""
    return Search(settings, reporter or Reporter(quiet=True)).run()


def follow_search(settings: SearchSettings) -> int:
    """A node other than 0 of a search across nodes: run this node's share of each of node 0's
    probes until that search ends (see autofit.probing._multinode). Returns the exit status."""
    from autofit.probing import DistributedWorker, JobBoard, follow

    session = Session(settings)  # the same study name and storage as node 0's

    def make_worker(meta: dict) -> DistributedWorker:
        usable = meta.get("usable_bytes")
        return DistributedWorker(session.script, settings.function, nproc=settings.nproc_per_node,
                                 device=settings.device, index=settings.index,
                                 memory_limit=meta.get("limit_bytes") or session.limit,
                                 usable_bytes=int(usable) if usable else None, log_dir=session.run_dir,
                                 nnodes=settings.nnodes, rdzv_endpoint=settings.rdzv_endpoint)

    return follow(settings, JobBoard(session.storage, session.study_name), make_worker)


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
