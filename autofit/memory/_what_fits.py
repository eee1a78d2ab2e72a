"""`autofit estimate`: which config would fit on a card of each size, predicted from fake-tensor
estimates (autofit.memory._estimator) before a single probe, with where its memory would go. For a
function that batches by tokens (run.token_batches) the sizes are token caps (`max_tokens`), each
estimated at its worst micro-batch: the data's longest samples, as many as the cap holds.

The answer per size is the most preferred strategy that fits a micro-batch, at the largest
micro-batch it fits: the fastest precision first (on GPUs bf16, fp16, tf32, fp32; on a CPU bf16 only
where it is native), then the fewest checkpointed blocks, selective checkpointing before full (it
recomputes the cheap ops only, and keeps the matmul, convolution and attention outputs). With no measured throughput that is a
rule, not a ranking: a search measures which is really fastest. More memory never gives a less
preferred strategy or a smaller micro-batch.

A strategy's tensor bytes grow linearly with the micro-batch once activations dominate: two
estimates fit that line, the line proposes the largest batch, and an estimate of that batch
confirms it (stepping down while it does not fit). The device's own memory is added to the tensor
bytes: on the CPU the estimator process's measured baseline and runtime context, and the heap's
typical growth over the live tensors (autofit.memory.CPU_TYPICAL_FACTOR); on a GPU a prior for the
CUDA context and the caching allocator's rounding (CUDA_CONTEXT_BYTES, ALLOCATOR_OVERHEAD), until
probes calibrate it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import product

from autofit.config import Config
from autofit.knobs import Offers
from autofit.memory._estimator import CUDA_CONTEXT_BYTES, Estimator, MemoryEstimate
from autofit.memory._peak_factors import CPU_TYPICAL_FACTOR, CUDA_TYPICAL_FACTOR
from autofit.memory._sizes import Sizes
from autofit.memory._traced_space import same_bytes
from autofit.options import SearchOptions
from autofit.planner import STRATEGY_KNOBS, Asked, Strategy, divisors_in, knob_values

#: Prior for a CUDA device: the caching allocator's rounding and caching over the tensors' own bytes, the
#: typical factor's (the context's prior is memory_estimate.CUDA_CONTEXT_BYTES).
ALLOCATOR_OVERHEAD = CUDA_TYPICAL_FACTOR - 1
#: Preference among precisions when nothing was measured: the fastest kinds first.
GPU_PREFERENCE = ("bf16", "fp16", "tf32", "fp32")


@dataclass(frozen=True)
class Fit:
    """The predicted config for one memory size (None: nothing fits), with its estimate."""

    memory_bytes: int
    usable_bytes: int
    config: Config | None
    estimate: MemoryEstimate | None
    predicted_peak_bytes: int | None


class WhatFits:
    """Estimates of one script, asked lazily and kept: each config is estimated at most once."""

    def __init__(self, script: str, function: str | None, *, on_gpu: bool, baseline_bytes: int | None = None,
                 batch_range: tuple[int, int] | None = None, global_batch: int | None = None,
                 precisions: tuple[str, ...] | None = None, checkpoint: bool = True,
                 consider: Mapping[str, tuple[str, ...]] | None = None,
                 token_range: tuple[int, int] | None = None) -> None:
        """`consider`: the values to consider of the knobs a search takes lists of (SearchOptions.consider),
        over the function's own declaration."""
        self.script, self.function = script, function
        self.on_gpu = on_gpu
        self.estimates: dict[Config, MemoryEstimate | None] = {}
        self.why_not: dict[Config, str] = {}
        # One process for every question, loaded once; for a GPU it counts CUDA's kernels (on the CPU).
        self.estimator = Estimator(script, function, target="cuda" if on_gpu else "cpu", beside_probes=False)
        self.estimator.wait_ready()
        # A function that keeps a global batch (@autofit(global_batch=...)): a framework integration
        # refuses a config that changes it, so the pilot must keep it too.
        pilot = self.estimator.estimate([_pilot(global_batch or self.estimator.options.get("global_batch"))], traced=True)
        self.baseline = CUDA_CONTEXT_BYTES if on_gpu else (
            (baseline_bytes or pilot.baseline_bytes or 0) + (pilot.context_bytes or 0))
        self.partial: MemoryEstimate | None = None
        """The pilot's estimate when the fake tensors could not follow a step: only its known parts."""
        self.notes: list[str] = []
        """What the estimates guessed or could not predict, one line each (from the pilot)."""
        if pilot.error or not pilot.estimates:
            self.unavailable = pilot.error or next(iter(pilot.unavailable.values()), "no estimate")
            return
        self.unavailable = None
        first = next(iter(pilot.estimates.values()))
        self.notes = [summary] if (summary := first.summary()) else []
        if not first.complete:
            self.partial = first
            return
        self.estimates.update(pilot.estimates)
        options = pilot.options or {}
        offers = pilot.offers or Offers()
        try:
            self.sizes = Sizes.of(offers, options, batch_range=batch_range, token_range=token_range,
                                  global_batch=global_batch)
        except Exception:
            self.close()  # a token range below the longest sample: no process is left behind
            raise
        self.batches = list(self.sizes.values)
        """The sizes to consider, smallest first: micro-batches, or token caps (`sizes.tokens`)."""
        wanted = precisions or tuple(options.get("precision") or ()) or None
        order = GPU_PREFERENCE if on_gpu else (("bf16", "fp32") if _native_cpu_bf16() else ("fp32",))
        self.precisions = tuple(p for p in order if wanted is None or p in wanted) if offers.autocast else ("fp32",)
        declared = {**(options.get("consider") or {}), **(consider or {})}
        asked = Asked(offers, SearchOptions(consider=declared, checkpoint=checkpoint, compile=False),
                      "cuda" if on_gpu else "cpu")
        self.values = {**knob_values(asked), "precision": self.precisions, "accumulation_steps": (1,)}
        """Each strategy knob's values, most preferred first: the fastest precision, the fewest checkpointed
        blocks, selective checkpointing before full (it recomputes less at as many blocks), a knob's default
        before its other values (the planner's order among them too)."""
        self.values["checkpoint_policy"] = tuple(sorted(self.values["checkpoint_policy"], key=lambda q: q != "selective"))

    def known_floor(self) -> int:
        """A partial estimate's device peak at least: the device's own memory and the known parts."""
        return self.peak(self.partial)

    def close(self) -> None:
        """Stop the estimator process."""
        self.estimator.close()

    def fill(self, configs: list[Config]) -> None:
        """Estimate every config not estimated yet, in one estimator process."""
        missing = list(dict.fromkeys(_as_estimated(c) for c in configs if _as_estimated(c) not in self.estimates))
        if not missing:
            return
        found = self.estimator.estimate(missing, traced=True)
        for config in missing:
            estimate = found.estimates.get(config)
            if estimate is not None and not estimate.complete:  # followed at batch 8, not at this one
                self.why_not[config] = estimate.why_missing or "partial estimate"
                estimate = None
            self.estimates[config] = estimate
            if config in found.unavailable:
                self.why_not[config] = found.unavailable[config]
            if estimate is not None:
                self.notes += [line for line in [estimate.summary()] if line and line not in self.notes]

    def peak(self, estimate: MemoryEstimate) -> int:
        """Predicted device peak: the device's own memory plus the tensors (and, on a GPU, rounding)."""
        factor = 1 + ALLOCATOR_OVERHEAD if self.on_gpu else CPU_TYPICAL_FACTOR
        return int(self.baseline + estimate.total_bytes * factor)

    def config(self, strategy: Strategy, batch: int) -> Config:
        """`strategy` at `batch`, a micro-batch or a token cap (`sizes.tokens`)."""
        return self.sizes.config(strategy, batch)

    def strategies(self) -> list[Strategy]:
        """Most preferred first (see `values`): a knob named later varies faster, any other knob than
        precision and checkpointing (offloading, say) only once those are at their most preferred."""
        names = sorted(self.values, key=lambda n: n in _PREFERRED)
        given = (Strategy(**dict(zip(names, combo))) for combo in product(*(self.values[n] for n in names)))
        return list(dict.fromkeys(Strategy(**{k.name: k.acting(s) for k in STRATEGY_KNOBS}) for s in given))

    def _line_batches(self) -> list[int]:
        return self.sizes.line()

    def _line(self, strategy: Strategy) -> tuple[int, int, float] | None:
        """(batch, peak, bytes per sample) through the largest two line points that rise; None
        when the peak does not rise over them (the optimizer step's peak dominates throughout)."""
        points = [(b, self.estimates.get(_as_estimated(self.config(strategy, b))))
                  for b in self._line_batches()]
        points = [(b, self.peak(e)) for b, e in points if e is not None]
        for (b1, p1), (b2, p2) in reversed(list(zip(points, points[1:]))):
            if p2 > p1:
                return b2, p2, (p2 - p1) / (b2 - b1)
        return None

    def proposals(self, strategy: Strategy, usable: int) -> list[int]:
        """Batches to confirm for `usable` bytes, largest first: the line's largest fit and the one
        below it (the line's error); the largest two when there is no line."""
        line = self._line(strategy)
        ceiling = self.data_ceiling()
        candidates = [b for b in self.batches if ceiling is None or b < ceiling] or self.batches[:1]
        if line is not None:
            b0, p0, slope = line
            fitting = [i for i, b in enumerate(candidates) if p0 + slope * (b - b0) <= usable]
            top = max(fitting) if fitting else 0
        else:
            top = len(candidates) - 1
        return [candidates[i] for i in range(top, max(-1, top - 2), -1)]

    def predict_all(self, sizes: list[int], headroom: float) -> list[Fit]:
        """The predicted config for each memory size. Round by round, each size still without an
        answer tries its next strategy in preference order: one estimator process for the lines of
        the strategies a round needs, one for their confirmations (usually one round in all)."""
        wanted = {size: int(size * (1 - headroom)) for size in sizes}
        answers: dict[int, Fit] = {}
        strategies = self.strategies()
        for strategy in strategies:
            open_sizes = [size for size in sizes if size not in answers]
            if not open_sizes:
                break
            self.fill([self.config(strategy, b) for b in self._line_batches()])
            for _ in range(3):  # again while confirmations found the data's end (proposals move below it)
                ceiling = self.data_ceiling()
                self.fill([self.config(strategy, b) for size in open_sizes
                           for b in self.proposals(strategy, wanted[size])])
                if self.data_ceiling() == ceiling:
                    break
            for size in open_sizes:
                fit = self._choose(size, wanted[size], [strategy])
                if fit.config is None and not self._beyond_reach(strategy, wanted[size]):
                    # the line was off: a coarser look below its proposal
                    below = self._coarse_below(max(self.proposals(strategy, wanted[size])))
                    self.fill([self.config(strategy, b) for b in below])
                    fit = self._choose(size, wanted[size], [strategy], everything=True)
                if fit.config is not None:
                    answers[size] = fit
        fits = [answers.get(size) or Fit(size, wanted[size], None, None, None) for size in sizes]
        return self._monotone(fits)

    def data_ceiling(self) -> int | None:
        """The smallest batch the data could not feed, in any strategy (the data does not change)."""
        bound = [c.size for c, why in self.why_not.items() if "DataTooSmall" in why and self._sized_here(c)]
        return min(bound) if bound else None

    def _sized_here(self, config: Config) -> bool:
        """`config` is sized as the sizes are (by tokens or by samples; the pilot is by samples)."""
        return (config.max_tokens is not None) == self.sizes.tokens

    def _beyond_reach(self, strategy: Strategy, usable: int) -> bool:
        """Even the smallest batch is estimated (or, by the line, predicted 10% or more) over `usable`."""
        smallest = self.estimates.get(_as_estimated(self.config(strategy, self.batches[0])))
        if smallest is not None:
            return self.peak(smallest) > usable
        estimated = [self.estimates.get(_as_estimated(self.config(strategy, b))) for b in self._line_batches()]
        lowest = min((self.peak(e) for e in estimated if e is not None), default=None)
        line = self._line(strategy)
        if lowest is not None and lowest > usable * 1.1 and line is None:
            return True  # flat, and over: the optimizer step alone does not fit
        return line is not None and line[1] + line[2] * (self.batches[0] - line[0]) > usable * 1.1

    def _coarse_below(self, top: int) -> list[int]:
        """The smallest batch and the powers of two up to `top`, largest first: one estimate per
        octave where the line failed, not one per batch."""
        ceiling = self.data_ceiling()
        return sorted({b for b in self.batches if b <= top and (ceiling is None or b < ceiling)
                       and (b == self.batches[0] or b & (b - 1) == 0)}, reverse=True)

    def data_bound(self, config: Config) -> bool:
        """The data feeds no batch of this strategy above `config`'s (memory is not what stops it)."""
        strategy = _strategy_of(_as_estimated(config))
        tried = sorted(c.size for c in (*self.estimates, *self.why_not)
                       if self._sized_here(c) and c.size > config.size and _strategy_of(c) == strategy)
        if not tried:
            return False
        why = self.why_not.get(_as_estimated(self.config(strategy, tried[0])))
        return why is not None and "DataTooSmall" in why

    def _monotone(self, fits: list[Fit]) -> list[Fit]:
        """A config that fits a smaller card fits a larger one: never answer worse for more memory."""
        order = self.strategies()

        def rank(fit: Fit) -> tuple:
            if fit.config is None:
                return (len(order), 0)
            return (order.index(_strategy_of(fit.config)), -fit.config.size)

        best: Fit | None = None
        out = {}
        for fit in sorted(fits, key=lambda f: f.memory_bytes):
            if best is not None and rank(best) < rank(fit):
                fit = Fit(fit.memory_bytes, fit.usable_bytes, best.config, best.estimate, best.predicted_peak_bytes)
            best = fit
            out[fit.memory_bytes] = fit
        return [out[f.memory_bytes] for f in fits]

    def _choose(self, size: int, usable: int, strategies: list[Strategy], everything: bool = False) -> Fit:
        for strategy in strategies:
            batches = self.proposals(strategy, usable)
            if everything:
                batches = self._coarse_below(max(batches))
            for batch in batches:
                estimate = self.estimates.get(_as_estimated(self.config(strategy, batch)))
                if estimate is not None and self.peak(estimate) <= usable:
                    return Fit(size, usable, self.config(strategy, batch), estimate, self.peak(estimate))
        return Fit(size, usable, None, None, None)


def _as_estimated(config: Config) -> Config:
    """TF32 changes the matmul unit, not a tensor's bytes: estimated as fp32 (the CPU has none). fp16
    holds the bytes bf16 does (its loss scaler's few scalars aside): as bf16, one estimate for both."""
    precision = same_bytes(config.precision)
    return config if precision == config.precision else dataclasses.replace(config, precision=precision)


def _strategy_of(config: Config) -> Strategy:
    """The strategy `config` trains (as `WhatFits.strategies` names it: no accumulation, which the
    global batch sets)."""
    return Strategy(**{k.name: k.acting(config) for k in STRATEGY_KNOBS if k.name != "accumulation_steps"})


#: The knobs `WhatFits.strategies` orders by preference (precision first, then checkpointing): the others
#: vary slowest, their defaults first.
_PREFERRED = ("precision", "checkpoint_segments", "checkpoint_policy")


def _native_cpu_bf16() -> bool:
    from autofit.devices import cpu_has_native_bf16

    return cpu_has_native_bf16()


def _pilot(global_batch: int | None) -> Config:
    """The first config estimated: micro-batch 8, or the largest divisor of the global batch up to 8
    with the accumulation that keeps it."""
    if not global_batch:
        return Config(batch_size=8)
    batch = divisors_in(global_batch, 1, 8)[-1]
    return Config(batch_size=batch, accumulation_steps=global_batch // batch)
