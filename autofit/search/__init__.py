"""A search as it runs: what it is given (`SearchSettings`), the study it opens or resumes, the
probes it runs through a runner, its phases (explore with the planner, recheck, confirm, export), its
clock and what it prints. `run_search` from Python, `search_function` for the decorator's
`train.search()`, `follow_search` for the other nodes of a search across machines."""

from __future__ import annotations

from autofit.search._api import follow_search, run_search, search_function
from autofit.search._interrupt import take_ctrl_c
from autofit.search._progress import LiveReporter, Reporter
from autofit.search._settings import SearchResult, SearchSettings

__all__ = [
    "LiveReporter",
    "Reporter",
    "SearchResult",
    "SearchSettings",
    "follow_search",
    "run_search",
    "search_function",
    "take_ctrl_c",
]
