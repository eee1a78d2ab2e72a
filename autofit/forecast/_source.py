"""What a forecast starts from: the measured probes of a best-config file or a study, grouped by strategy.

A strategy is everything of a config but its micro-batch and accumulation (precision, checkpointing,
compile, ...): along a strategy the peak grows with the micro-batch. A file holds the winner and the
best config of each other strategy (its runner-ups, with their peaks); a study holds every probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autofit.config import Config

#: Config fields that are not the strategy: the micro-batch and how a step is made of it.
_NOT_STRATEGY = ("batch_size", "accumulation_steps", "global_batch", "global_tokens", "ranks", "label")
#: Fields of a file's or a frame's row that are measurements, not config.
_MEASURED = ("samples_per_s", "tokens_per_s", "peak_bytes", "flops_per_s", "mfu")


@dataclass
class Strategy:
    """One strategy's measured micro-batches: the largest peak at each, and its samples/s (the file's
    figure where it has one, else the first probe's)."""

    fields: dict[str, Any]
    peaks: dict[int, float] = field(default_factory=dict)
    rates: dict[int, float] = field(default_factory=dict)

    @property
    def precision(self) -> str:
        return str(self.fields.get("precision"))

    def label(self) -> str:
        ckpt = self.fields.get("checkpoint_segments") or 0
        extra = f" ckpt={ckpt}" if ckpt else ""
        return f"{self.precision}{extra}"

    def rate_near(self, batch_size: int) -> tuple[int, float] | None:
        """The measured rate at the largest micro-batch up to `batch_size`, else at the smallest measured."""
        if not self.rates:
            return None
        below = [b for b in self.rates if b <= batch_size]
        b = max(below) if below else min(self.rates)
        return b, self.rates[b]


def _key(entry: dict[str, Any]) -> tuple:
    """The strategy's fields as Config writes them (a knob at its default left out), so a file's short
    runner-up and a study's full row of the same strategy meet."""
    fields = Config.from_dict({k: v for k, v in entry.items() if k not in _MEASURED}).to_dict()
    return tuple(sorted((k, v) for k, v in fields.items() if k not in _NOT_STRATEGY))


def _add(strategies: dict[tuple, Strategy], entry: dict[str, Any]) -> None:
    batch = entry.get("batch_size")
    if not batch:
        return
    key = _key(entry)
    strategy = strategies.setdefault(key, Strategy(dict(key)))
    peak, rate = entry.get("peak_bytes"), entry.get("samples_per_s")
    if peak is not None and peak == peak:  # NaN: a probe without a peak
        strategy.peaks[int(batch)] = max(float(peak), strategy.peaks.get(int(batch), 0.0))
    if rate is not None and rate == rate:  # the first kept: the file's (confirmed) figure before a study's probes
        strategy.rates.setdefault(int(batch), float(rate))


def strategies_of(document: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> list[Strategy]:
    """The strategies a file (`document`) or a study (its probes as `rows`, status "ok") measured, the
    winner's first."""
    winner = dict(document.get("config") or {})
    strategies: dict[tuple, Strategy] = {}
    _add(strategies, {**winner, **{k: document.get("measured", {}).get(k) for k in _MEASURED}})
    for entry in document.get("runner_ups") or []:
        _add(strategies, entry)
    for row in rows or []:
        _add(strategies, row)
    return list(strategies.values())
