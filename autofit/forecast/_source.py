"""What a forecast starts from: the measured probes of a best-config file or a study, grouped by strategy.

A strategy is everything of a config but its micro-batch and accumulation (precision, checkpointing,
compile, ...): along a strategy the peak grows with the micro-batch. A file holds the winner and the
best config of each other strategy (its runner-ups, with their peaks); a study holds every probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autofit.config import Config
from autofit.export import BestConfig

#: Config fields that are not the strategy: the micro-batch and how a step is made of it.
_NOT_STRATEGY = ("batch_size", "accumulation_steps", "global_batch", "global_tokens", "ranks", "label")
#: Fields of a file's or a frame's row that are measurements, not config.
_MEASURED = ("samples_per_s", "tokens_per_s", "peak_bytes", "flops_per_s", "mfu")


@dataclass(frozen=True)
class Measured:
    """What a forecast starts from: the best-config file (`best`), a study's probes that ran (`rows`), the
    memory estimator's (low, high) peak bytes per sample of each strategy it estimated (`per_sample`, by
    strategy key), and what was read (`source`, for the output)."""

    best: BestConfig
    rows: list[dict[str, Any]] = field(default_factory=list)
    per_sample: dict[tuple, tuple[float, float]] = field(default_factory=dict)
    source: str = ""


@dataclass
class Strategy:
    """One strategy's measured micro-batches: the largest peak at each, and its samples/s (the file's
    figure where it has one, else the first probe's)."""

    fields: dict[str, Any]
    peaks: dict[int, float] = field(default_factory=dict)
    rates: dict[int, float] = field(default_factory=dict)
    per_sample: tuple[float, float] | None = None
    """The memory estimator's (low, high) peak bytes per sample (a study's; None: none)."""

    @property
    def precision(self) -> str:
        return str(self.fields.get("precision"))

    def label(self) -> str:
        """The strategy's configs' label without their micro-batch: 'bf16 ckpt=2 selective'."""
        words = Config.from_dict({**self.fields, "batch_size": 1}).label().split()
        return " ".join(w for w in words if not w.startswith("b="))

    def rate_near(self, batch_size: int) -> tuple[int, float] | None:
        """The measured rate at the largest micro-batch up to `batch_size`, else at the smallest measured."""
        if not self.rates:
            return None
        below = [b for b in self.rates if b <= batch_size]
        b = max(below) if below else min(self.rates)
        return b, self.rates[b]


def strategy_key(entry: dict[str, Any]) -> tuple:
    """The strategy's fields as Config writes them (a knob at its default left out), so a file's short
    runner-up and a study's full row of the same strategy meet."""
    fields = Config.from_dict({k: v for k, v in entry.items() if k not in _MEASURED}).to_dict()
    return tuple(sorted((k, v) for k, v in fields.items() if k not in _NOT_STRATEGY))


def _add(strategies: dict[tuple, Strategy], entry: dict[str, Any]) -> None:
    batch = entry.get("batch_size")
    if not batch:
        return
    key = strategy_key(entry)
    strategy = strategies.setdefault(key, Strategy(dict(key)))
    peak, rate = entry.get("peak_bytes"), entry.get("samples_per_s")
    if peak is not None and peak == peak:  # NaN: a probe without a peak
        strategy.peaks[int(batch)] = max(float(peak), strategy.peaks.get(int(batch), 0.0))
    if rate is not None and rate == rate:  # the first kept: the file's (confirmed) figure before a study's probes
        strategy.rates.setdefault(int(batch), float(rate))


def strategies_of(measured: Measured) -> list[Strategy]:
    """The strategies a file or a study measured, the winner's first. A runner-up ranked by tokens keeps its rate
    as samples/s at the winner's tokens per sample (the file keeps one rate of each runner-up: the one it was
    ranked by; both batch the same data), so it is forecast, not left without a rate."""
    best = measured.best
    strategies: dict[tuple, Strategy] = {}
    _add(strategies, {**best.config.to_dict(), "samples_per_s": best.measured.samples_per_s,
                      "peak_bytes": best.measured.peak_bytes})
    per_s = best.measured.samples_per_s, best.measured.tokens_per_s
    tokens_per_sample = per_s[1] / per_s[0] if all(per_s) else None
    for runner in best.runner_ups:
        rate = runner.rate
        if runner.config.ranked_by.name != "samples_per_s":  # by tokens: its rate in samples, where the file says how
            rate = rate / tokens_per_sample if rate and tokens_per_sample else None
        _add(strategies, {**runner.config.to_dict(), "samples_per_s": rate, "peak_bytes": runner.peak_bytes})
    for row in measured.rows:
        _add(strategies, row)
    for key, strategy in strategies.items():
        strategy.per_sample = measured.per_sample.get(key)
    return list(strategies.values())


def per_sample_bytes(breakdowns: dict[Any, dict[str, int]], factors: tuple[float, float]
                     ) -> dict[tuple, tuple[float, float]]:
    """From the estimator's tensor bytes of some configs (Config to bytes by part): each strategy's
    per-sample bytes, the gentlest and the steepest slope between its estimated micro-batches times the
    device's (low, high) peak factor."""
    curves: dict[tuple, dict[int, float]] = {}
    for config, parts in breakdowns.items():
        curve = curves.setdefault(strategy_key(config.to_dict()), {})
        curve[config.batch_size] = max(curve.get(config.batch_size, 0.0), float(sum(parts.values())))
    slopes = {}
    for key, curve in curves.items():
        sizes = sorted(curve)
        steps = [(curve[b] - curve[a]) / (b - a) for a, b in zip(sizes, sizes[1:], strict=False)]
        if steps:
            slopes[key] = (max(0.0, min(steps)) * factors[0], max(0.0, max(steps)) * factors[1])
    return slopes
