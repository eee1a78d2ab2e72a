"""The search from Python: `run_search(settings)` and the decorator's `train.search(...)`."""

from __future__ import annotations

from typing import Any

from autofit.export import MemoryBudget
from autofit.search._loop import Search
from autofit.search._progress import Reporter
from autofit.search._session import Session
from autofit.search._settings import SearchResult, SearchSettings


def run_search(settings: SearchSettings, reporter: Reporter | None = None) -> SearchResult:
    """Search the best config for `settings.script`; see SearchSettings for the knobs."""
    return Search(settings, reporter or Reporter(quiet=True)).run()


def follow_search(settings: SearchSettings) -> int:
    """A node other than 0 of a search across nodes: run this node's share of each of node 0's
    probes until that search ends (see autofit.probing.follow). Returns the exit status."""
    from autofit.probing import JobBoard, follow, make_runner

    session = Session(settings)  # the same study name and storage as node 0's
    env = {"PYTORCH_CUDA_ALLOC_CONF": settings.alloc_conf} if settings.alloc_conf else None

    def make_follower(budget: MemoryBudget):
        return make_runner(session.script, settings.function, device=settings.device, index=settings.index,
                           budget=budget if budget.limit_bytes is not None else session.memory_budget, log_dir=session.run_dir,
                           env=env, nproc=settings.nproc_per_node, nnodes=settings.nnodes,
                           rdzv_endpoint=settings.rdzv_endpoint, probe_process=settings.probe_process)

    return follow(JobBoard(session.storage, session.study_name), make_follower, node_rank=settings.node_rank,
                  nnodes=settings.nnodes)


def search_function(fn: Any, **kwargs: Any) -> SearchResult:
    """`train.search(budget="20m", memory_limit="2GiB", ...)` from Python."""
    import inspect

    from autofit.config import CONSIDERED
    from autofit.errors import UsageError
    from autofit.options import renamed
    from autofit.units import parse_duration, parse_size

    for old, new in (("batch_size", "batch_range"), ("workers", "parallel")):  # their old names
        if old in kwargs:
            if new in kwargs:
                raise UsageError(f"Give {new}= only, but got both {new}= and its old name {old}=.")
            renamed(f"train.search({old}=...)", f"train.search({new}=...)")
            kwargs[new] = kwargs.pop(old)
    if "budget" in kwargs:
        kwargs["budget_s"] = parse_duration(kwargs.pop("budget"))
    if isinstance(kwargs.get("memory_limit"), str):
        kwargs["memory_limit"] = parse_size(kwargs["memory_limit"])
    # A knob's list of values to consider by the knob's own name (`NAME=("a", "b")`), as @autofit takes it.
    listed = {k.name: kwargs.pop(k.name) for k in CONSIDERED if k.name in kwargs}
    if listed:
        kwargs["consider"] = {**kwargs.get("consider", {}), **listed}
    reporter = kwargs.pop("reporter", None)
    script = inspect.getsourcefile(fn.fn)
    return run_search(SearchSettings(script=script, function=fn.fn.__name__, **kwargs), reporter)
