"""A config's peak memory predicted before it is probed: the memory estimator's tensor bytes
(autofit.memory), anchored on measured peaks, carried as a range.

Tensor bytes are not the device's peak. The allocator's caching and rounding, oneDNN's or cuDNN's
workspaces and the data add to them, and by a factor that differs per device and model: on the
recorded CPU landscapes (benchmarks/landscapes) each extra tensor byte costs 1.0-2.4 bytes of peak.
So a prediction starts from a measured peak (the same strategy's nearest ones when it has any,
another strategy's otherwise: the offset) and adds the difference in tensor bytes times the lowest and the
highest factor still believable (the slope): the device's prior range (autofit.memory's `peak_factors`) until
two probes measure it, the strategy's own once two of its own do. The planner probes a config only when the
high end fits (`safe`), and rules one out when even the low end does not (`too_big`): everything between is a
gamble it takes only for a faster config. Before any probe there is no anchor: the device's bytes and the
tensors at the prior's factors, whose high end is believed only where the prior was checked against measured
peaks of the device type (`MemoryPrediction.trusted`: CUDA's), and raised by every OOM seen.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from autofit.config import Config
from autofit.planner._observation import Observation
from autofit.planner._search_space import STRATEGY_KNOBS

#: The knobs whose values make memory curves of their own (those of a strategy but the accumulation, which
#: shares its micro-batch's curve: `line_key` adds whether it holds gradients).
MEMORY_KNOBS = tuple(k for k in STRATEGY_KNOBS if k.name != "accumulation_steps")
#: The strategy knobs the memory estimator does not see: it runs the model eager, compiled or not.
_NOT_ESTIMATED = ("compile",)

#: A measured peak moves this much between two probes of one config (allocator, oneDNN scratch).
_PEAK_NOISE = 0.02
#: Another strategy's peak says less: its own overheads (recomputation, casts) differ.
_FOREIGN_NOISE = 0.05
#: Two probes of a strategy measure its factor only when their tensor bytes differ by this much
#: more than their peaks' noise.
_MIN_SPAN = 4.0

TensorBytes = Callable[[Config], "float | None"]


#: Micro-batches a search asks the estimator for (the nearest of each curve's), besides its
#: smallest and (when not absurdly large) its largest: a search's batch range is often far wider
#: than its data or memory allow.
_ESTIMATE_BATCHES = (8, 32, 128, 512, 2048)
_LARGEST_ESTIMATED = 8192


def configs_to_estimate(configs: Iterable[Config]) -> list[Config]:
    """Which configs a search asks the estimator for: per memory curve, a few micro-batches about
    4x apart (the rest are interpolated); curves without checkpointing first (the planner explores
    them first), so an estimator stopped early has answered those."""
    curves: dict[tuple, dict[int, Config]] = {}
    for config in configs:
        eager = Config(batch_size=config.batch_size, max_tokens=config.max_tokens,
                       **{k.name: k.acting(config) for k in STRATEGY_KNOBS if k.name not in _NOT_ESTIMATED})
        curves.setdefault(estimated_key(config), {}).setdefault(config.size, eager)
    out = []
    for _, by_batch in sorted(curves.items(), key=lambda item: next(iter(item[1].values())).checkpoint_segments > 0):
        batches = sorted(by_batch)
        wanted = {batches[0]}
        if batches[-1] <= _LARGEST_ESTIMATED:
            wanted.add(batches[-1])
        for target in _ESTIMATE_BATCHES:
            if batches[0] < target < batches[-1]:
                wanted.add(min(batches, key=lambda b: abs(math.log(b / target))))
        out += [by_batch[b] for b in sorted(wanted)]
    return out


def memory_key(item) -> tuple:
    """What shares one measured memory curve: each strategy knob's value as it acts (precision, checkpointed
    blocks and policy, sharding, compilation, ...; not accumulation), in MEMORY_KNOBS' order."""
    return tuple(k.acting(item) for k in MEMORY_KNOBS)


def estimated_key(item) -> tuple:
    """What shares one estimated curve: `memory_key` without compilation (the estimator runs the model eager,
    compiled or not)."""
    return tuple(k.acting(item) for k in MEMORY_KNOBS if k.name not in _NOT_ESTIMATED)


@dataclass(frozen=True)
class PeakRange:
    """Predicted peak bytes, between `low` and `high`: a prediction, not a measurement."""

    low: float
    high: float

    @property
    def middle(self) -> float:
        return (self.low + self.high) / 2


class MemoryPrediction:
    """The estimator's tensor bytes of a search's configs, and the device's prior factor range and
    typical factor (peak bytes per tensor byte: autofit.memory's `peak_factors`)."""

    def __init__(self, tensor_bytes: TensorBytes, *, device_bytes: float, factors: tuple[float, float],
                 typical_factor: float, floor_bytes: float | None = None, trusted: bool = False,
                 reach: Callable[[Config], int | None] | None = None) -> None:
        self.tensor_bytes = tensor_bytes
        #: The largest size of a config's strategy that was estimated (None: not known, or no estimate).
        self.reach = reach or (lambda config: None)
        #: What the device holds beside the tensors (on CPU the process and its runtime's context,
        #: measured by the estimator; on a GPU the CUDA context).
        self.device_bytes = float(device_bytes)
        self.factors = factors
        self.typical_factor = typical_factor
        #: The factor range holds before any probe (measured peaks of this device type fell inside it): a
        #: config is predicted to fit at its high end before a probe anchors it (the pilot is sized so).
        #: Untrusted, a prediction without an anchor is a floor only.
        self.trusted = trusted
        #: Tensor bytes every config holds at least, where only some parts were estimated (the
        #: parameters, gradients and optimizer state of a step the fake tensors could not follow).
        self.floor_bytes = floor_bytes

    def covers(self, config: Config) -> bool:
        """Whether `config`'s size is within what its strategy's estimates reached (beyond, the prediction is
        extrapolated, and the data may not feed it)."""
        reach = self.reach(config)
        return reach is None or config.size <= reach

    @classmethod
    def from_estimates(cls, estimated: Mapping[Config, float], **kwargs) -> MemoryPrediction:
        """From estimates of some configs: the others of a strategy interpolated along the batch
        (linear between two estimated batches; beyond them, the last two batches' slope)."""
        curves: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
        for config, value in estimated.items():
            curves[estimated_key(config)].append((config.size, float(value)))
        for points in curves.values():
            points.sort()

        def tensor_bytes(config: Config) -> float | None:
            points = curves.get(estimated_key(config))
            if not points:
                return None
            if len(points) == 1:
                return points[0][1] if points[0][0] == config.size else None
            i = bisect.bisect_left([b for b, _ in points], config.size)
            i = min(max(i, 1), len(points) - 1)
            (b1, v1), (b2, v2) = points[i - 1], points[i]
            return max(0.0, v1 + (v2 - v1) * (config.size - b1) / (b2 - b1))

        def reach(config: Config) -> int | None:
            points = curves.get(estimated_key(config))
            return points[-1][0] if points else None

        return cls(tensor_bytes, reach=reach, **kwargs)

    def raw_peak(self, config: Config) -> float | None:
        """The peak predicted before any probe measured one: the device's own bytes and the tensors
        at the typical factor (None where the config's strategy has no estimate)."""
        tensor = self.tensor_bytes(config)
        return None if tensor is None else self.device_bytes + self.typical_factor * tensor

    def calibrate(self, observations: Iterable[Observation]) -> CalibratedPrediction:
        return CalibratedPrediction(self, observations)


class CalibratedPrediction:
    """Predictions from the peaks measured so far."""

    def __init__(self, prediction: MemoryPrediction, observations: Iterable[Observation]) -> None:
        self.prediction = prediction
        observations = list(observations)
        peaks: dict[Config, float] = {}
        for o in observations:
            if o.status == "ok" and o.peak_bytes:
                peaks[o.config] = max(peaks.get(o.config, 0.0), float(o.peak_bytes))
        #: memory key -> (batch, tensor bytes, measured peak), by batch
        self.anchors: dict[tuple, list[tuple[int, float, float]]] = defaultdict(list)
        for config, peak in sorted(peaks.items(), key=lambda item: item[0].size):
            tensor = prediction.tensor_bytes(config)
            if tensor is not None:
                self.anchors[memory_key(config)].append((config.size, tensor, peak))
        measured = {key: found for key, points in self.anchors.items() if (found := self._pair_factors(points))}
        #: Peak bytes per tensor byte (the slope): the range the pairs of every strategy's probes allow, or the
        #: device's prior; a strategy with two probes of its own measures its own (`_own_factors`).
        self.factors = ((min(low for low, _ in measured.values()), max(high for _, high in measured.values()))
                        if measured else prediction.factors)
        self._own_factors = measured
        self._unanchored = self._raised_by_ooms(observations)

    def _pair_factors(self, points: list[tuple[int, float, float]]) -> tuple[float, float] | None:
        """The range of peak bytes per tensor byte that pairs of one strategy's probes allow."""
        low, high = [], []
        for i, (_, t1, p1) in enumerate(points):
            for _, t2, p2 in points[i + 1:]:
                span, noise = abs(t2 - t1), _PEAK_NOISE * (p1 + p2)
                if span * self.prediction.factors[0] < _MIN_SPAN * noise / 2:
                    continue
                rise = (p2 - p1) if t2 > t1 else (p1 - p2)
                low.append(max(0.0, (rise - noise) / span))
                high.append((rise + noise) / span)
        return (min(low), max(high)) if low else None

    def _raised_by_ooms(self, observations: Iterable[Observation]) -> tuple[float, float]:
        """The factor range of a prediction no probe anchors, raised to what each OOM showed: it held more than
        the peak it ran out of memory at, so its tensors cost at least that much over the device's bytes."""
        low, high = self.factors
        for o in observations:
            tensor = self.prediction.tensor_bytes(o.config) if o.status == "oom" and o.peak_bytes else None
            if tensor:
                least = (float(o.peak_bytes) - self.prediction.device_bytes) / tensor
                low, high = max(low, least), max(high, least * (1 + _FOREIGN_NOISE))
        return low, high

    def peak(self, config: Config) -> PeakRange | None:
        """The predicted peak of `config`; None without an estimate or anything to anchor it.

        Between two measured batches of its strategy, memory's monotonicity bounds it: at least
        the peak below, at most the peak above. Beyond them, from the nearest measured batch, the
        difference in tensor bytes times the factor range. A strategy not measured yet starts from
        the measured config (of any strategy) nearest in tensor bytes, with a wider slack.
        """
        if config.max_squares is not None:
            return None  # the estimator runs the space's caps, never a squares cap (rule 9's variants)
        tensor = self.prediction.tensor_bytes(config)
        if tensor is None:
            return None
        own = self.anchors.get(memory_key(config))
        if own:
            below = [a for a in own if a[0] <= config.size]
            above = [a for a in own if a[0] >= config.size]
            if below and above:
                slack = _PEAK_NOISE * below[-1][2]
                return PeakRange(below[-1][2] - slack, above[0][2] + _PEAK_NOISE * above[0][2])
            return self._from_anchor(tensor, below[-1] if below else above[0], _PEAK_NOISE,
                                     self._own_factors.get(memory_key(config), self.factors))
        foreign = [a for points in self.anchors.values() for a in points]
        if foreign:
            return self._from_anchor(tensor, min(foreign, key=lambda a: abs(a[1] - tensor)), _FOREIGN_NOISE, self.factors)
        low_factor, high_factor = self._unanchored
        device = self.prediction.device_bytes
        return PeakRange(device + low_factor * tensor,
                         device + high_factor * tensor if self.prediction.trusted else float("inf"))

    def _from_anchor(self, tensor: float, anchor: tuple[int, float, float], noise: float,
                     factors: tuple[float, float]) -> PeakRange:
        """From a measured peak (the offset): the difference in tensor bytes at the lowest and highest factor
        (the slope: the strategy's own where its probes measured it)."""
        _, anchor_tensor, anchor_peak = anchor
        delta = tensor - anchor_tensor
        slack = noise * anchor_peak
        k_low, k_high = factors
        return PeakRange(anchor_peak + min(k_low * delta, k_high * delta) - slack,
                         anchor_peak + max(k_low * delta, k_high * delta) + slack)

    def safe(self, config: Config, usable: float) -> bool:
        """Predicted to fit even at the high end of its range."""
        found = self.peak(config)
        return found is not None and found.high <= usable

    def too_big(self, config: Config, usable: float) -> bool:
        """Predicted not to fit even at the low end of its range; without a prediction, when the
        tensors known to be held (a partial estimate's floor) alone do not fit. A floor makes no
        config a gamble: the planner explores above it as it would without an estimate."""
        found = self.peak(config)
        if found is None:
            floor = self.prediction.floor_bytes
            return bool(floor) and self.prediction.device_bytes + floor > usable
        return found.low > usable
