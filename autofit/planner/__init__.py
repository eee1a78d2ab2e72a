"""autofit's search strategy as pure logic over observations (no Optuna, no torch): the search space,
the fitted memory and throughput models, noise, memory predictions, and the `Planner` that says which
config to probe next and how the probed ones rank. The live search, parallel workers, `autofit show`
and the benchmark's replays all ask the same planner."""

from __future__ import annotations

from autofit.planner._ab import AB_ENTRANTS, AB_ROUNDS, ABPlan
from autofit.planner._knob_values import Asked, compute_variants, knob_values, offered_values
from autofit.planner._loader_rule import (
    MIN_LOADER_SHARE,
    LoaderChoices,
    loader_reason,
    loader_worker_counts,
    next_loader_config,
    shared_cores_loader_note,
    wait_share,
)
from autofit.planner._models import Line, ThroughputModel, fit_line, fit_throughput
from autofit.planner._noise import Measurement, NoiseReading
from autofit.planner._observation import FAILED_STATUSES, Observation
from autofit.planner._planner import Planner
from autofit.planner._prediction import (
    CalibratedPrediction,
    MemoryPrediction,
    PeakRange,
    configs_to_estimate,
    estimated_key,
    memory_key,
)
from autofit.planner._ranking import TIE_TOLERANCE, Candidate, dominates
from autofit.planner._recompute import holds_gradients
from autofit.planner._search_space import (
    STRATEGY_KNOBS,
    SearchSpace,
    Strategy,
    checkpoint_levels,
    divisors_in,
    nice_batch_sizes,
    size_axis,
    token_caps,
)
from autofit.planner._squares_rule import next_squares_config, squares_reason

__all__ = [
    "AB_ENTRANTS",
    "STRATEGY_KNOBS",
    "Asked",
    "compute_variants",
    "knob_values",
    "offered_values",
    "size_axis",
    "AB_ROUNDS",
    "ABPlan",
    "FAILED_STATUSES",
    "MIN_LOADER_SHARE",
    "TIE_TOLERANCE",
    "CalibratedPrediction",
    "Candidate",
    "Line",
    "LoaderChoices",
    "Measurement",
    "MemoryPrediction",
    "NoiseReading",
    "Observation",
    "PeakRange",
    "Planner",
    "SearchSpace",
    "Strategy",
    "ThroughputModel",
    "checkpoint_levels",
    "configs_to_estimate",
    "dominates",
    "divisors_in",
    "estimated_key",
    "fit_line",
    "fit_throughput",
    "holds_gradients",
    "loader_reason",
    "next_squares_config",
    "squares_reason",
    "memory_key",
    "next_loader_config",
    "nice_batch_sizes",
    "shared_cores_loader_note",
    "token_caps",
    "wait_share",
    "loader_worker_counts",
]
