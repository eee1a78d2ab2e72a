"""What the planner believes about a strategy's memory: a line peak = a + m x batch (one for its
configs that accumulate, one for those that do not: `holds_gradients`), fitted from the peaks measured (or borrowed from the nearest fitted strategy with a prior ratio), raised to agree
with every OOM seen, and believed beyond the usable memory only past its own margin of error; and the
memory estimator's prediction, calibrated on the probes so far."""

from __future__ import annotations

import math
from collections.abc import Sequence

from autofit.config import Config
from autofit.planner._models import Line, fit_line
from autofit.planner._observation import Observation
from autofit.planner._prediction import MEMORY_KNOBS, CalibratedPrediction, PeakRange, memory_key
from autofit.planner._recompute import OTHER_LEVERS, holds_gradients
from autofit.planner._search_space import SearchSpace, Strategy

#: Prior for how much a strategy's per-sample memory shrinks, relative to fp32 without checkpointing.
_HALF_PRECISION_SLOPE = 0.6
_FULL_CHECKPOINT_SLOPE = 0.4
#: The same with every block under selective checkpointing, which keeps the matmul outputs.
_SELECTIVE_CHECKPOINT_SLOPE = 0.7
#: The same with another memory lever set (a knob declared `lever` the rules below do not name: activation offload,
#: which moves what the offered blocks save off the device, as full checkpointing of all of them drops it).
_OTHER_LEVER_SLOPE = 0.4
#: A line borrowed with a prior ratio (no peak of its own) predicts a lever's first batch fits only where its
#: per-sample part, this much larger, still fits: how far the priors above have been off (selective kept 0.65 of the
#: plain slope on the memory stand-in, full checkpointing of half the blocks 0.51 where the prior says 0.7).
_PRIOR_SLACK = 0.25

MemoryKey = tuple
#: How far apart two memory lines are for each knob they differ in (a count: by how much it differs; a knob
#: not named: 1), and for holding gradients through a forward or not.
_DISTANCE = {"precision": 10, "sharding": 5, "compile": 3, "gradients": 1}


def line_key(item) -> MemoryKey:
    """What shares one memory line: `memory_key`, and whether gradients live through a forward."""
    return *memory_key(item), holds_gradients(item)


def _named(key: MemoryKey) -> dict:
    """A line key's values by knob name (MEMORY_KNOBS'), "gradients" last."""
    return dict(zip((*(k.name for k in MEMORY_KNOBS), "gradients"), key))


def _distance(a: dict, b: dict) -> float:
    return sum(abs(x - b[n]) if type(x) is int else _DISTANCE.get(n, 1) * (x != b[n]) for n, x in a.items())


class MemoryModels:
    """Every strategy's memory line, fitted once per reading of the observations."""

    def __init__(self, space: SearchSpace, usable: float, done: Sequence[Observation],
                 predicted: CalibratedPrediction | None) -> None:
        self.space = space
        self.usable = usable
        self.done = done
        self.predicted = predicted
        """The memory estimator's prediction, calibrated on the probes so far (None without one)."""
        self._lines: dict[MemoryKey, Line | None] = {}
        self._max_k = max(space.values_of("checkpoint_segments")) or 1

    def peaks(self, strategy: Strategy) -> list[tuple[float, float]]:
        return self._peaks(line_key(strategy))

    def _peaks(self, key: MemoryKey) -> list[tuple[float, float]]:
        return [
            (o.config.size, float(o.peak_bytes)) for o in self.done
            if o.status == "ok" and o.peak_bytes and line_key(o.config) == key
        ]

    def margin(self, strategy: Strategy) -> float | None:
        """How far past the usable memory a prediction must land to be believed without a probe.

        Fitted on this strategy's own peaks: its residuals (at least 3%). Through one own peak with a
        borrowed slope: 15%. With no own peak: never believed.
        """
        return self._margin(line_key(strategy))

    def _margin(self, key: MemoryKey) -> float | None:
        own = self._peaks(key)
        line = fit_line(own)
        if line is not None:
            return max(0.03, 2 * line.max_rel_residual)
        return 0.15 if own else None

    def _prior_ratio(self, named: dict) -> float:
        """The prior share of the fp32 plain slope a line key keeps (`_named`): by its precision, its checkpointing
        and any other memory lever set."""
        precision = _HALF_PRECISION_SLOPE if named["precision"] in ("bf16", "fp16") else 1.0
        kept = _SELECTIVE_CHECKPOINT_SLOPE if named["checkpoint_policy"] == "selective" else _FULL_CHECKPOINT_SLOPE
        blocks = 1 - (1 - kept) * named["checkpoint_segments"] / self._max_k
        if any(named[k.name] != k.default for k in OTHER_LEVERS):
            blocks = min(blocks, _OTHER_LEVER_SLOPE)
        return precision * blocks

    def line(self, strategy: Strategy) -> Line | None:
        """peak = a + m*batch for this precision, sharding and checkpoint level.

        Fitted from its own peaks when it has two batch sizes; otherwise borrowed from the nearest
        fitted strategy with a prior ratio (sharding splits the weights and optimizer state, not the
        activations: an unsharded intercept is an upper bound). Raised to agree with every OOM seen.
        """
        return self._line(line_key(strategy))

    def _line(self, key: MemoryKey) -> Line | None:
        if key in self._lines:
            return self._lines[key]
        own = self._peaks(key)
        line = fit_line(own)
        if line is None or line.slope <= 0:
            line = self._borrowed_line(key, own)
        if line is not None:
            line = self._respect_ooms(line, key)
        self._lines[key] = line
        return line

    def _borrowed_line(self, key: MemoryKey, own: list[tuple[float, float]]) -> Line | None:
        """The nearest fitted line of the space's others (by `_distance`), its slope scaled by the priors."""
        mine = _named(key)
        references = []
        for other in dict.fromkeys(line_key(s.replaced(accumulation_steps=a)) for s in self.space.strategies()
                                   for a in (1, 2)):
            ref = fit_line(self._peaks(other))
            if ref is not None and ref.slope > 0:
                references.append((_distance(mine, _named(other)), _named(other), ref))
        if not references:
            return None
        _, near, ref = min(references, key=lambda r: r[0])
        slope = ref.slope * self._prior_ratio(mine) / self._prior_ratio(near)
        if own:  # one peak of its own: the borrowed intercept (weights, optimizer) through it
            b, peak = max(own)
            if peak > ref.intercept:
                return Line(ref.intercept, (peak - ref.intercept) / b)
            return Line(peak - slope * b, slope)
        return Line(ref.intercept, slope)

    def _respect_ooms(self, line: Line, key: MemoryKey) -> Line:
        slope = line.slope
        for o in self.done:
            if o.status == "oom" and line_key(o.config) == key:
                # It crossed at least the usable memory at this batch.
                slope = max(slope, (self.usable - line.intercept) / o.config.size)
        return Line(line.intercept, slope, line.max_rel_residual, line.points)

    def says_too_big(self, config: Config) -> bool:
        """The measured memory line, beyond its margin, or the prediction, at its low end, says it
        does not fit."""
        if self.predicted is not None and self.predicted.too_big(config, self.usable):
            return True
        key = line_key(config)
        margin, line = self._margin(key), self._line(key)
        if margin is not None and line is not None and line(config.size) > self.usable * (1 + margin):
            return True
        # Its twin that holds gradients through a forward as it does not (or the other way round): the same
        # activations a sample, so the twin's slope alone (no intercept: weights, gradients, optimizer) is a
        # floor under its peak. At a fixed global batch the one micro-batch without accumulation has no line
        # of its own, and was proposed at a 25x overshoot because of it.
        twin = (*key[:-1], not key[-1])
        twin_margin, twin_line = self._margin(twin), self._line(twin)
        return (twin_margin is not None and twin_line is not None
                and twin_line.slope * config.size > self.usable * (1 + twin_margin))

    def likely_too_big(self, config: Config) -> bool:
        """The best guess puts `config` over the usable memory (not yet beyond a margin of error, `says_too_big`):
        the middle of the estimator's range where it answers, else the memory line."""
        found = self._predicted_range(config)
        if found is not None:
            return found.middle > self.usable
        line = self._line(line_key(config))
        return line is not None and line(config.size) > self.usable

    def may_not_fit(self, config: Config) -> bool:
        """The estimator's range, anchored on a measured peak, reaches over the usable memory."""
        found = self._predicted_range(config)
        return found is not None and found.high > self.usable

    def fits_for_sure(self, config: Config) -> bool | None:
        """Predicted to fit at the high end of what is known of `config`: the estimator's range where it answers;
        else the memory line, beyond its margin where the strategy has peaks of its own, its per-sample part taken
        _PRIOR_SLACK larger where it is borrowed (a prior ratio, no peak of its own). None: nothing predicts it."""
        found = self._predicted_range(config)
        if found is not None:
            return found.high <= self.usable
        key = line_key(config)
        line = self._line(key)
        if line is None:
            return None
        if self._peaks(key):
            return line(config.size) * (1 + self._margin(key)) <= self.usable
        return line.intercept + line.slope * config.size * (1 + _PRIOR_SLACK) <= self.usable

    def _predicted_range(self, config: Config) -> PeakRange | None:
        """The estimator's prediction of `config`, where it answers with a bounded range."""
        found = self.predicted.peak(config) if self.predicted is not None else None
        return found if found is not None and math.isfinite(found.high) else None

    def predicted_gamble(self, config: Config) -> bool:
        """Predicted neither to fit nor not to: probing it risks an OOM."""
        return (self.predicted is not None and self.predicted.peak(config) is not None
                and not self.predicted.safe(config, self.usable))
