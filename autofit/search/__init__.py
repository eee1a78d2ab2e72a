"""The search: autofit's planner inside an Optuna study, with a budget, confirmation and export."""

from autofit.search._loop import SearchResult, SearchSettings, run_search, search_function
from autofit.search._observation import Observation
from autofit.search._planner import Candidate, Planner
from autofit.search._progress import LiveReporter, Reporter
from autofit.search._space import SearchSpace, Strategy

__all__ = [
    "run_search", "search_function", "SearchSettings", "SearchResult", "Planner", "Candidate",
    "Observation", "SearchSpace", "Strategy", "Reporter", "LiveReporter",
]
