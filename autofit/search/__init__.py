"""Writing a study: autofit's planner inside an Optuna study, with a budget, rechecks, confirmation and
export. Its modules, in the order a search uses them: _settings (what it is given), _resume (the study
it opens), _space (what it may try), _planner (+ _models, _noise, _observation: what to try next),
_sampler (the planner as an Optuna sampler), _liveness (who runs a trial), _budget (its clock),
_loop (the phases), _explain (why the winner won), _progress (what it prints), _api (from Python)."""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the module that defines it. Imported on first use, so that reading a study (which
#: needs the planner and the explanations) never loads the search loop, and nothing imports in a circle.
_EXPORTS = {
    "run_search": "_api", "search_function": "_api", "follow_search": "_api",
    "SearchSettings": "_settings", "SearchResult": "_settings",
    "Planner": "_planner", "Candidate": "_planner", "Observation": "_observation",
    "SearchSpace": "_space", "Strategy": "_space", "Reporter": "_progress", "LiveReporter": "_progress",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'autofit.search' has no attribute {name!r}")
    return getattr(importlib.import_module(f"autofit.search.{_EXPORTS[name]}"), name)
