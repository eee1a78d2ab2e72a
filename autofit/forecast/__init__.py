"""Forecasts for GPUs you don't have: from a config measured on one device, the config to run on another,
its throughput with an interval, and what it costs (`autofit forecast`).

_gpus: the GPU table (memory, dense peaks, achievable matmul, bandwidth; dated); _prices: $/GPU-hour (dated,
overridable); _model: throughput scaled part by part by what bounds it; _pairs: the held-out pairs, which
measure the interval's margin once there are enough; _memory: the largest micro-batch
that fits; _source: a file's or study's measured strategies; _answer: the forecast record; _read: a file
or a study as a forecast's input.
"""

from autofit.forecast._answer import Forecast, StrategyFit, TargetForecast, forecast, target_precision
from autofit.forecast._gpus import (
    ASSUMED_MATMUL_EFFICIENCY,
    DEFAULT_TARGETS,
    GPUS,
    SPECS_DATE,
    GpuSpec,
    gpu_spec,
    spec_of_device,
)
from autofit.forecast._memory import CONTEXT_BYTES, MemoryLine, largest_fit, usable_bytes
from autofit.forecast._model import Rate, naive_ratios, scale_rate
from autofit.forecast._pairs import HELD_OUT, MARGIN, MIN_PAIRS, HeldOutPair, interval_margin
from autofit.forecast._prices import PRICES, PRICES_DATE, Price, price_for
from autofit.forecast._read import forecast_input, study_input
from autofit.forecast._source import Measured, per_sample_bytes

__all__ = [
    "ASSUMED_MATMUL_EFFICIENCY",
    "CONTEXT_BYTES",
    "DEFAULT_TARGETS",
    "GPUS",
    "HELD_OUT",
    "MARGIN",
    "MIN_PAIRS",
    "PRICES",
    "PRICES_DATE",
    "SPECS_DATE",
    "Forecast",
    "GpuSpec",
    "HeldOutPair",
    "Measured",
    "MemoryLine",
    "Price",
    "Rate",
    "StrategyFit",
    "TargetForecast",
    "forecast",
    "forecast_input",
    "gpu_spec",
    "interval_margin",
    "largest_fit",
    "naive_ratios",
    "per_sample_bytes",
    "price_for",
    "scale_rate",
    "spec_of_device",
    "study_input",
    "target_precision",
    "usable_bytes",
]
