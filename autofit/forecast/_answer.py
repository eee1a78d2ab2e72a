"""A forecast for each target GPU: the config to run there, its rate with an interval, and what it costs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from autofit.config import Config
from autofit.errors import UsageError
from autofit.export import BestConfig, MeasuredFigures
from autofit.forecast._gpus import GpuSpec, gpu_spec, spec_of_device
from autofit.forecast._memory import MemoryLine, largest_fit, usable_bytes
from autofit.forecast._model import Rate, scale_rate
from autofit.forecast._pairs import interval_margin
from autofit.forecast._prices import PRICES_DATE, Price, price_for
from autofit.forecast._source import Measured, Strategy, strategies_of
from autofit.units import format_size

#: The headroom of a file that does not say (a search's default).
DEFAULT_HEADROOM = 0.1
BY_TOKENS = "by tokens: the measured token cap kept, where its measured peak fits"
UNCHECKED = "no measured peak: the measured micro-batch, not checked against the target's memory"
#: A precision a target lacks, and what it runs instead (autocast's fp16 takes a GradScaler; tf32 is fp32's
#: tensor-core rate, fp32 runs without it).
FALLBACK = {"bf16": "fp16", "tf32": "fp32"}


def target_precision(precision: str, spec: GpuSpec) -> str:
    """The precision `spec` runs in place of `precision` (itself where it runs it)."""
    return precision if spec.runs(precision) else FALLBACK.get(precision, "fp32")


@dataclass(frozen=True)
class StrategyFit:
    """One strategy on a target: its largest micro-batch that fits (0: none) and its rate there."""

    label: str
    precision: str
    batch_size: int
    peak_bytes: float | None
    rate: Rate | None
    rate_from_batch: int | None
    memory_basis: str


@dataclass(frozen=True)
class TargetForecast:
    """What to run on one target GPU, how fast, and at what price."""

    gpu: GpuSpec
    usable_bytes: float
    fits: list[StrategyFit]
    chosen: StrategyFit | None
    config: dict[str, Any] | None
    price: Price | None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Forecast:
    """Forecasts of one measured config for several GPUs, and what is known of the source."""

    source: str
    device: str
    tokens_per_sample: float | None
    world_size: int
    targets: list[TargetForecast]
    budget: float | None
    """Tokens (or samples, without tokens) to train, for hours and total cost; None: not asked."""
    notes: list[str] = field(default_factory=list)

    @property
    def unit(self) -> tuple[str, float]:
        """What costs are per: ("billion tokens", 1e9), or ("million samples", 1e6) without tokens."""
        return ("billion tokens", 1e9) if self.tokens_per_sample else ("million samples", 1e6)

    def units_per_s(self, target: TargetForecast) -> tuple[float, float, float] | None:
        """Tokens (or samples) per second on `target`, all ranks together: point, low, high."""
        if target.chosen is None or target.chosen.rate is None:
            return None
        return target.chosen.rate.scaled(self.tokens_per_sample or 1.0)

    def cost(self, target: TargetForecast, amount: float) -> tuple[float, float, float] | None:
        """Dollars for `amount` tokens (samples): at the typical price and the point rate, then the range
        from the low price at the fast end to the typical price at the slow end."""
        rates = self.units_per_s(target)
        if rates is None or target.price is None:
            return None
        point, low, high = rates
        gpus = self.world_size
        return (target.price.typical * gpus * amount / point / 3600, target.price.low * gpus * amount / high / 3600,
                target.price.typical * gpus * amount / low / 3600)

    def hours(self, target: TargetForecast) -> tuple[float, float, float] | None:
        rates = self.units_per_s(target)
        if rates is None or not self.budget:
            return None
        point, low, high = rates
        return self.budget / point / 3600, self.budget / high / 3600, self.budget / low / 3600

    def recommendation(self) -> dict[str, str | None]:
        """The cheapest per token (typical price), the fastest, and the smallest GPU that fits."""
        fitting = [t for t in self.targets if t.chosen is not None]
        rated = [t for t in fitting if self.units_per_s(t)]
        priced = [t for t in rated if t.price is not None]
        amount = self.unit[1]
        return {
            "cheapest": min(priced, key=lambda t: self.cost(t, amount)[0]).gpu.name if priced else None,
            "fastest": max(rated, key=lambda t: self.units_per_s(t)[0]).gpu.name if rated else None,
            "smallest": min(fitting, key=lambda t: t.gpu.memory_bytes).gpu.name if fitting else None,
        }

    def to_dict(self) -> dict[str, Any]:
        """The forecast for tools (`autofit forecast --json`): JSON, every figure finite (one that is not, from a
        file that holds a NaN, is null: bare NaN is no JSON)."""
        unit, amount = self.unit
        return _finite({
            "source": self.source, "device": self.device, "world_size": self.world_size,
            "tokens_per_sample": self.tokens_per_sample, "cost_unit": unit, "budget": self.budget,
            "prices_date": PRICES_DATE, "notes": self.notes,
            "targets": [self._target_dict(t, amount) for t in self.targets],
            "recommendation": self.recommendation(),
        })

    def _target_dict(self, target: TargetForecast, amount: float) -> dict[str, Any]:
        chosen = target.chosen
        rate = chosen.rate if chosen else None
        tokens = self.units_per_s(target) if self.tokens_per_sample else None
        return {
            "gpu": target.gpu.name, "memory_bytes": target.gpu.memory_bytes, "usable_bytes": target.usable_bytes,
            "fits": chosen is not None, "config": target.config,
            "peak_bytes": chosen.peak_bytes if chosen else None,
            "samples_per_s": None if rate is None else dict(zip(("point", "low", "high"), rate.scaled(1.0),
                                                                strict=True)),
            "tokens_per_s": None if tokens is None else dict(zip(("point", "low", "high"), tokens, strict=True)),
            "rate_basis": rate.basis if rate else None,
            "interval_margin": rate.margin_from if rate and rate.margin_from else None,
            "price_per_gpu_hour": target.price.to_dict() if target.price else None,
            "cost_per_unit": _triple(self.cost(target, amount)),
            "hours": _triple(self.hours(target)),
            "cost_of_budget": _triple(self.cost(target, self.budget) if self.budget else None),
            "strategies": [{"strategy": f.label, "precision": f.precision, "batch_size": f.batch_size,
                            "peak_bytes": f.peak_bytes, "samples_per_s": f.rate.samples_per_s if f.rate else None,
                            "memory_basis": f.memory_basis} for f in target.fits],
            "notes": target.notes,
        }


def _finite(value: Any) -> Any:
    """`value` (the forecast's dict) with every float that is not finite as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _triple(values: tuple[float, float, float] | None) -> dict[str, float] | None:
    return None if values is None else dict(zip(("point", "low", "high"), values, strict=True))


def _memory_fit(strategy: Strategy, usable: float, global_batch: int | None) -> tuple[int, float | None, str]:
    """A strategy's micro-batch on the target, its predicted peak, and what they rest on."""
    if not strategy.peaks:  # a rate without a peak (a published figure): its micro-batch as it was, unchecked
        return max(strategy.rates), None, UNCHECKED
    if strategy.fields.get("max_tokens") is not None:  # by tokens memory follows the token cap, not the samples
        batch = max(strategy.peaks)
        fits = strategy.peaks[batch] <= usable
        return (batch if fits else 0), (strategy.peaks[batch] if fits else None), BY_TOKENS
    line = MemoryLine.through(strategy.peaks, strategy.per_sample)
    batch = largest_fit(line, usable, global_batch)
    return batch, (line.peak(batch) if batch else None), line.basis


def _fit(strategy: Strategy, source: GpuSpec | None, target: GpuSpec, usable: float, global_batch: int | None,
         measured: MeasuredFigures) -> StrategyFit:
    precision = target_precision(strategy.precision, target)
    batch, peak, basis = _memory_fit(strategy, usable, global_batch)
    near = strategy.rate_near(batch) if batch else None
    rate = None if near is None else scale_rate(near[1], measured.flops_per_sample, strategy.precision,
                                                source, target, precision, measured.profile)
    return StrategyFit(strategy.label(), precision, batch, peak, rate, near[0] if near else None, basis)


def _target(strategies: list[Strategy], source: GpuSpec | None, target: GpuSpec, searched: BestConfig,
            prices: dict[str, float] | None) -> TargetForecast:
    # a file that names no memory (a document made from published figures) keeps the default headroom
    headroom = searched.memory.headroom if searched.memory.limit_bytes is not None else DEFAULT_HEADROOM
    global_batch = searched.global_batch
    usable = usable_bytes(target.memory_bytes, headroom)
    fits = [_fit(s, source, target, usable, global_batch, searched.measured) for s in strategies]
    fitting = [i for i, f in enumerate(fits) if f.batch_size > 0]  # the fastest, the winner's first on a tie
    best = max(fitting, key=lambda i: fits[i].rate.samples_per_s if fits[i].rate else 0.0) if fitting else None
    chosen = None if best is None else fits[best]
    notes = []
    run = None
    if chosen is not None:
        strategy = strategies[best]
        accumulation = global_batch // chosen.batch_size if global_batch else searched.config.accumulation_steps
        run = {**Config.from_dict({**strategy.fields, "precision": chosen.precision, "batch_size": chosen.batch_size,
                                   "accumulation_steps": accumulation}).to_dict(), "global_batch": global_batch}
        if chosen.precision != strategy.precision:
            notes.append(f"{target.name} has no {strategy.precision}: {chosen.precision} instead"
                         + (" (autocast with a GradScaler)" if chosen.precision == "fp16" else ""))
        if chosen.memory_basis == UNCHECKED:
            notes.append(UNCHECKED)
        if strategy.peaks and chosen.batch_size < min(strategy.peaks):
            notes.append(f"b={chosen.batch_size} is below the smallest micro-batch measured (b={min(strategy.peaks)}): "
                         "its peak is extrapolated, and may be a few percent higher (the headroom covers it)")
        if chosen.rate_from_batch is not None and chosen.rate_from_batch > chosen.batch_size:
            notes.append(f"the rate is scaled from b={chosen.rate_from_batch}, larger than b={chosen.batch_size}: "
                         "a smaller micro-batch is often slower")
    else:
        notes.append(f"no measured strategy fits {target.name}'s usable memory, even at b=1: "
                     "search on it, or with activation checkpointing")
    return TargetForecast(target, usable, fits, chosen, run, price_for(target.name, prices), notes)


def _source_notes(best: BestConfig, source: GpuSpec | None) -> list[str]:
    measured = best.measured
    if source is None:
        kind = "a CPU" if best.device_type == "cpu" else f"a GPU autofit has no figures of ({best.device_name})"
        memory = ("memory from its peaks (a CPU's count the whole process: on a GPU the same tensors usually "
                  "take less)" if best.device_type == "cpu" else "memory from its peaks")
        rate = ("throughput only as a wide estimate from the FLOPs per sample (20-50% of the target's achievable "
                "matmul), not a measurement" if measured.flops_per_sample else
                "no throughput: the file has no FLOPs per sample to estimate one from")
        return [f"measured on {kind}: {memory}; {rate}"]
    basis = "profile" if measured.profile else "mfu" if measured.flops_per_sample else "no-flops"
    margin, margin_from = interval_margin(basis)
    interval = f"interval: the model's bounds widened by {margin - 1:.0%}, {margin_from}"
    if measured.profile:
        return ["throughput: each kernel class of the recorded profile scaled by its bound", interval]
    if measured.flops_per_sample:
        return ["throughput: no kernel-class profile in the file: the split between compute and the rest comes "
                "from the measured MFU, and the interval is wider", interval]
    return ["throughput: the file has no FLOPs per sample (written before they were recorded): the rate lies "
            "between the bandwidth and the matmul ratios, the widest interval", interval]


def _positive(value: float, what: str) -> float:
    """`value`, a figure a forecast multiplies by: a positive, finite number (nan or inf gives `nan-nan`)."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise UsageError(f"{what} must be a positive, finite number, but got {value!r}.")
    return float(value)


def _tokens_per_sample(best: BestConfig, given: float | None, notes: list[str]) -> float | None:
    """The tokens a sample holds: the file's (its tokens/s over its samples/s), else the one given, which the
    notes state as an assumption; one given that disagrees with the file's own count is refused."""
    per_s = best.measured.samples_per_s, best.measured.tokens_per_s
    counted = per_s[1] / per_s[0] if all(v and math.isfinite(v) for v in per_s) else None  # NaN: none counted
    if given is None:
        return counted
    given = _positive(given, "The tokens per sample")
    if counted is not None and abs(given / counted - 1) > 0.01:
        raise UsageError(f"The tokens per sample must agree with the file's own count ({counted:,.1f} a sample), "
                         f"but got {given:,.1f}: leave --tokens-per-sample out.")
    if counted is None:
        notes.append(f"tokens: {given:,.0f} a sample, as given (--tokens-per-sample): the file counts samples only")
    return counted or given


def _memory_cap_note(best: BestConfig) -> str | None:
    """What becomes of the memory limit the source was searched under, where it was below its device's memory:
    each target is sized by its own memory (the limit dropped), but a token cap found under it is kept."""
    limit, total = best.memory.limit_bytes, best.device_memory
    if not limit or not total or limit >= total:
        return None
    kept = ("; the token cap found under that limit is kept as measured (carried over: a search on the target "
            "may find a larger one)" if best.config.max_tokens is not None else "")
    return (f"the source was searched under a memory limit of {format_size(limit)} (its device has "
            f"{format_size(total)}): each target's micro-batch is sized by the target's own memory less the "
            f"headroom, the limit dropped{kept}")


def _budget(tokens_per_sample: float | None, tokens: float | None, samples: float | None) -> float | None:
    """What to train, in the forecast's unit: tokens where the file counts them, else samples."""
    tokens = None if tokens is None else _positive(tokens, "The tokens to train")
    samples = None if samples is None else _positive(samples, "The samples to train")
    if tokens is not None and samples is not None:
        raise UsageError(f"A budget is given in tokens or in samples, but got both: --tokens {tokens:,.0f} "
                         f"and --samples {samples:,.0f}; give one.")
    if tokens is not None and not tokens_per_sample:
        raise UsageError(f"A budget in tokens needs a file that counts tokens, but this one counts samples only: "
                         f"give --samples instead of --tokens {tokens:,.0f}, or the tokens a sample holds with "
                         f"--tokens-per-sample (nanoGPT's: its block_size).")
    if samples is not None and tokens_per_sample:
        return samples * tokens_per_sample
    return tokens if tokens is not None else samples


def forecast(measured: Measured | BestConfig | dict[str, Any], targets: list[GpuSpec], *,
             prices: dict[str, float] | None = None, tokens: float | None = None,
             samples: float | None = None, tokens_per_sample: float | None = None) -> Forecast:
    """Forecast the measured config (`forecast_input`'s answer, or a best-config file alone, as its record or
    its JSON's dict) for each of `targets`; `prices`: $/GPU-hour by GPU name, over the table's; `tokens` or
    `samples`: what to train, for hours and the cost of it all; `tokens_per_sample`: the tokens a sample holds,
    for a file that counts samples only (a loop of its own, nanoGPT's), stated in the notes."""
    if isinstance(measured, dict):
        measured = BestConfig.from_dict(measured)
    if isinstance(measured, BestConfig):
        measured = Measured(measured)
    best = measured.best
    prices = {gpu_spec(name).name: _positive(value, f"The price of {name}") for name, value in (prices or {}).items()}
    unknown = sorted(set(prices) - {t.name for t in targets})
    if unknown:
        raise UsageError(f"A --price must name a target GPU ({', '.join(t.name for t in targets)}), "
                         f"but got {', '.join(unknown)}.")
    spec = spec_of_device(best.device_name, best.device_memory) if best.device_type == "cuda" else None
    world = best.world_size
    notes = _source_notes(best, spec)
    tokens_per_sample = _tokens_per_sample(best, tokens_per_sample, notes)
    if world > 1:
        notes.append(f"measured on {world} ranks: rates are all ranks together, costs count {world} GPUs, "
                     "communication is not rescaled")
    memory = _memory_cap_note(best)
    if memory:
        notes.append(memory)
    strategies = strategies_of(measured)
    return Forecast(source=measured.source, device=str(best.device_name or best.device_type),
                    tokens_per_sample=tokens_per_sample, world_size=world,
                    targets=[_target(strategies, spec, t, best, prices) for t in targets],
                    budget=_budget(tokens_per_sample, tokens, samples), notes=notes)
