"""What the planner believes about a strategy's memory: a line peak = a + m x batch (one for its
configs that accumulate, one for those that do not: `holds_gradients`), fitted from the peaks measured (or borrowed from the nearest fitted strategy with a prior ratio), raised to agree
with every OOM seen, and believed beyond the usable memory only past its own margin of error; and the
memory estimator's prediction, calibrated on the probes so far."""

from __future__ import annotations

from collections.abc import Sequence

from autofit.config import Config
from autofit.planner._models import Line, fit_line
from autofit.planner._observation import Observation
from autofit.planner._prediction import MEMORY_KNOBS, CalibratedPrediction, memory_key
from autofit.planner._recompute import holds_gradients
from autofit.planner._search_space import SearchSpace, Strategy

#: Prior for how much a strategy's per-sample memory shrinks, relative to fp32 without checkpointing.
_HALF_PRECISION_SLOPE = 0.6
_FULL_CHECKPOINT_SLOPE = 0.4
#: The same with every block under selective checkpointing, which keeps the matmul outputs.
_SELECTIVE_CHECKPOINT_SLOPE = 0.7

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

    def _prior_ratio(self, precision: str, k: int, policy: str = "full") -> float:
        ratio = _HALF_PRECISION_SLOPE if precision in ("bf16", "fp16") else 1.0
        kept = _SELECTIVE_CHECKPOINT_SLOPE if policy == "selective" else _FULL_CHECKPOINT_SLOPE
        return ratio * (1 - (1 - kept) * k / self._max_k)

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
        slope = ref.slope * self._prior_ratio(mine["precision"], mine["checkpoint_segments"], mine["checkpoint_policy"]) \
            / self._prior_ratio(near["precision"], near["checkpoint_segments"], near["checkpoint_policy"])
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

    def predicted_gamble(self, config: Config) -> bool:
        """Predicted neither to fit nor not to: probing it risks an OOM."""
        return (self.predicted is not None and self.predicted.peak(config) is not None
                and not self.predicted.safe(config, self.usable))
