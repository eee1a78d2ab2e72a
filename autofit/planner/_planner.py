"""autofit's search strategy: which config to probe next, from what the probes so far say.

Pure logic over `Observation`s (no Optuna, no torch), so the live search, parallel workers and the
benchmark's replays all run the same decisions. The rules, in order:

1. Memory is monotone: within one precision and sharding, peak memory rises with micro-batch and
   falls with more checkpointed blocks. An OOM (or a peak inside the headroom) at batch b implies the same at every
   larger batch with as many or fewer checkpointed blocks; a fit implies fits below. Implied answers
   are never probed.
2. A memory model per strategy (peak = a + m*batch, fitted from the peaks measured, bounded below by
   the OOMs) jumps straight to the largest batch predicted to fit, instead of doubling from 1. When
   the model, fitted on two or more points, predicts that the next batch would cross the usable
   memory by more than its own error, that batch is not probed.
3. A throughput model per strategy (time per micro-batch = c0 + c1*batch) bounds what a strategy can
   reach: strategies (and the rest of a bracket) that cannot beat the best so far are skipped;
   checkpointing, which only adds compute, is bounded by its precision's model without it, and a
   sharded strategy (FSDP2, which only adds communication) by the same strategy under DDP.
4. Throughput is noisy and not always monotone: the neighbours of the best batch are probed before
   the search ends, climbing while they improve.
5. With the memory estimator's prediction (see _prediction.py), from the first probe on: each
   strategy starts at the largest batch predicted to fit at the high end of its range, a batch
   whose low end does not fit is never probed, and one in between only if it could be faster.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from autofit.config import SHARDINGS, Config
from autofit.planner._models import Line, ThroughputModel, fit_line, fit_throughput
from autofit.planner._noise import NoiseReading
from autofit.planner._observation import Observation
from autofit.planner._prediction import CalibratedPrediction, MemoryPrediction, PeakRange, memory_key
from autofit.planner._space import SearchSpace, Strategy

#: Prior for how much a strategy's per-sample memory shrinks, relative to fp32 without checkpointing.
_HALF_PRECISION_SLOPE = 0.6
_FULL_CHECKPOINT_SLOPE = 0.4
#: A skipped strategy's optimistic bound must fall this far below the best so far.
_PRUNE_SLACK = 1.03
#: A config predicted to maybe not fit is probed only if it could be this much faster than the best:
#: an OOM probe costs a probe, and a batch near the memory limit is rarely much faster.
_GAMBLE_GAIN = 1.10
#: Configs within this fraction of the best throughput are ties, won by the lower peak.
TIE_TOLERANCE = 0.02
#: Prior slowdown of checkpointing every block (it recomputes the forward pass); measured values win.
_CHECKPOINT_SLOWDOWN = 0.2
_PILOT_BATCH = 4
#: Rechecks of suspect measurements always allowed, whatever the number of explore probes.
_MIN_RECHECKS = 4
_MAX_LEAP = 4
_PILOT_JUMP = 4


@dataclass(frozen=True)
class Candidate:
    """A feasible config with its measured throughput (median over its probes) and peak."""

    config: Config
    samples_per_s: float
    peak_bytes: int | None
    probes: int
    tight: bool = False  # some probe of it needed allocator retries: it only just fits


#: Close contenders: the first this many of the ranking, at least this share of the best's throughput.
_CONTENDERS = 3
_CONTENDER_SHARE = 0.95


class Planner:
    """Chooses the next config to probe. Every decision is made from the observations; what the planner
    holds besides are facts about the search (its space, usable memory, the estimator's predictions),
    which change only through `learn`."""

    def __init__(self, space: SearchSpace, usable_bytes: float, *, check_noise: bool = True,
                 prediction: MemoryPrediction | None = None) -> None:
        self.space = space
        self.usable = float(usable_bytes)
        #: Recheck suspect measurements and leave them out until resolved (see _noise.py).
        self.check_noise = check_noise
        #: The memory estimator's predictions, when there are any.
        self.prediction = prediction

    def learn(self, *, space: SearchSpace | None = None, prediction: MemoryPrediction | None = None) -> None:
        """New facts about the search: the space narrowed to the knobs the function offers (known after
        its first probe), the memory estimator's predictions (known once it answered). None: unchanged."""
        if space is not None:
            self.space = space
        if prediction is not None:
            self.prediction = prediction

    def _state(self, observations: Sequence[Observation]) -> _State:
        return _State(self.space, self.usable, observations, self.check_noise, self.prediction)

    # --- public -------------------------------------------------------------------------------
    def next(self, observations: Sequence[Observation]) -> Config | None:
        """The next config to probe, or None when the search has nothing left worth probing."""
        state = self._state(observations)
        if not state.any_observed:
            return self._pilot()
        for strategy in self._order(state):
            if state.strategy_unusable(strategy):
                continue
            proposal = self._next_in_strategy(state, strategy)
            if proposal is not None:
                return proposal
        return self._refine_best(state)

    def ranked(self, observations: Sequence[Observation]) -> list[Candidate]:
        """Feasible configs, best first: throughput, with near-ties broken toward configs that did
        not need allocator retries, then toward lower peak."""
        return self._state(observations).ranked()

    def best(self, observations: Sequence[Observation]) -> Config | None:
        ranked = self.ranked(observations)
        return ranked[0].config if ranked else None

    def unusable_precisions(self, observations: Sequence[Observation]) -> set[str]:
        return self._state(observations).unusable_precisions()

    def memory_models(self, observations: Sequence[Observation]) -> dict[Strategy, Line]:
        """The fitted memory line (peak = a + m x batch) of every strategy that has one, as the
        planner uses it to decide what fits (the report draws them)."""
        state = self._state([o for o in observations if o.status != "running"])
        tried = {self.space.strategy_of(o.config) for o in state.observations}
        models = {s: state.memory_model(s) for s in self.space.strategies() if s in tried}
        return {s: line for s, line in models.items() if line is not None}

    def memory_line(self, strategy: Strategy, observations: Sequence[Observation]) -> Line | None:
        """The memory line the planner decides with for one strategy (its own, or one borrowed)."""
        return self._state(observations).memory_model(strategy)

    def predicted_peak(self, config: Config, observations: Sequence[Observation]) -> PeakRange | None:
        """The memory estimator's prediction of `config`'s peak, calibrated on the probes so far."""
        state = self._state(observations)
        return state.predicted.peak(config) if state.predicted is not None else None

    def recheck(self, observations: Sequence[Observation]) -> Config | None:
        """A config whose measurement is suspect (see _noise.py) and must be probed again before it
        may win or bound anything; the fastest first. None when there is none, or when rechecks
        already cost half as many probes as exploring did (a machine that noisy is reported)."""
        if not self.check_noise:
            return None
        state = self._state(observations)
        rechecks = sum(o.phase == "recheck" for o in state.observations)
        explored = sum(o.phase == "explore" for o in state.observations)
        if rechecks >= max(_MIN_RECHECKS, explored // 2):
            return None
        running = {o.config for o in state.observations if o.status == "running"}
        waiting = [c for c in state.noise.unresolved() if c not in running]
        if waiting:
            return max(waiting, key=state.noise.rate)
        if self.next(observations) is not None:
            return None  # leaders are confirmed once exploring is done
        leaders = [c for c in state.noise.unconfirmed_leaders() if c not in running]
        return leaders[0] if leaders else None

    def contenders(self, observations: Sequence[Observation]) -> list[Config]:
        """The close contenders to measure again, longer, before a winner is named, best first: the first
        three of the ranking as it stood before any remeasurement, within 5% of the best and measured once
        then; those remeasured already are left out."""
        before = [o for o in observations if o.phase != "remeasure"]
        remeasured = {o.config for o in observations if o.phase == "remeasure"}
        ranked = self.ranked(before)
        if not ranked:
            return []
        close = _CONTENDER_SHARE * ranked[0].samples_per_s
        return [c.config for c in ranked[:_CONTENDERS]
                if c.samples_per_s >= close and c.probes <= 1 and c.config not in remeasured]

    def to_confirm(self, observations: Sequence[Observation]) -> Config | None:
        """The config to confirm with a long run: the ranking's first, unless a confirmation run
        measured it already (then the search has its winner); None when nothing ranks."""
        ranked = self.ranked(observations)
        if not ranked or any(o.phase == "confirm" and o.config == ranked[0].config for o in observations):
            return None
        return ranked[0].config

    def noise_summary(self, observations: Sequence[Observation]) -> str | None:
        """One line when the machine was too noisy to rank configs; None otherwise."""
        return self._state(observations).noise.summary()

    # --- decisions ----------------------------------------------------------------------------
    def _pilot(self) -> Config:
        strategy = self.space.strategies()[0]
        sizes = self.space.batch_sizes
        batch = next((b for b in sizes if b >= _PILOT_BATCH), sizes[-1])
        return self.space.config(strategy, batch)

    def _order(self, state: _State) -> list[Strategy]:
        """Pilot strategy, then each precision without checkpointing, then checkpointing levels
        (best precision first, fewest blocks first), then other accumulations, then shardings."""
        strategies = self.space.strategies()
        first_acc = strategies[0].accumulation_steps

        def best_of_precision(p: str) -> float:
            return max((c.samples_per_s for c in state.ranked() if c.config.precision == p), default=0.0)

        def key(s: Strategy) -> tuple:
            return (
                s.compile,  # compiled strategies once eager ones are known: they start at eager's best
                SHARDINGS.index(s.sharding),
                s.accumulation_steps != first_acc,
                s.checkpoint_segments > 0,
                -best_of_precision(s.precision) if s.checkpoint_segments else self.space.precisions.index(s.precision),
                s.checkpoint_segments,
            )

        return sorted(strategies, key=key)

    def _next_in_strategy(self, state: _State, strategy: Strategy) -> Config | None:
        """Bracket the largest batch that fits, guided by the memory model; None when resolved."""
        candidates = [b for b in state.open_batches(strategy)
                      if not state.model_says_too_big(self.space.config(strategy, b))]
        if not candidates:
            return None
        if state.cannot_beat_best(strategy, candidates):
            return None
        if state.predicted is not None and any(state.predicted.peak(self.space.config(strategy, b)) for b in candidates):
            return self._predicted_next(state, strategy, candidates)
        own = state.peaks(strategy)
        if not own:
            return self.space.config(strategy, self._first_batch(state, strategy, candidates))
        memory = state.memory_model(strategy)
        if memory is None:
            # One point and nothing to borrow an intercept from: step up, or bisect (geometrically)
            # between the largest fit and the smallest OOM.
            low = state.fit_max(strategy) or self.space.batch_sizes[0]
            high = state.oom_min(strategy)
            target = (low * high) ** 0.5 if high else low * _PILOT_JUMP
            below = [b for b in candidates if b <= target]
            return self.space.config(strategy, max(below) if below else min(candidates))
        # Extrapolate at most _MAX_LEAP x beyond the largest batch measured: a model fitted on small
        # batches is least sure far away, and an OOM costs more than one more step up.
        measured = max(b for b, _ in own)
        predicted_max = min(memory.solve(self.usable), measured * _MAX_LEAP)
        below = [b for b in candidates if b <= predicted_max]
        if below:
            return self.space.config(strategy, max(below))
        smallest = min(candidates)
        if state.model_says_too_big(self.space.config(strategy, smallest)):
            return None  # the model, beyond its margin of error, says nothing open fits
        return self.space.config(strategy, smallest)

    def _predicted_next(self, state: _State, strategy: Strategy, candidates: list[int]) -> Config | None:
        """With predictions: the largest batch predicted to fit at the high end of its range; when
        none is, the smallest still possible, and only if it could beat the best so far."""
        configs = [self.space.config(strategy, b) for b in candidates]
        safe = [c for c in configs if state.predicted.safe(c, self.usable)]
        if safe:
            return max(safe, key=lambda c: c.batch_size)
        gamble = min(configs, key=lambda c: c.batch_size)
        if state.fit_max(strategy) is None:
            return gamble  # nothing of this family fits yet: the smallest is the one to try
        ranked = state.ranked()
        estimate = state.estimate_throughput(strategy, gamble.batch_size)
        if ranked and (estimate is None or estimate < ranked[0].samples_per_s * _GAMBLE_GAIN):
            return None
        return gamble

    def _first_batch(self, state: _State, strategy: Strategy, candidates: list[int]) -> int:
        """A strategy's first probe is an anchor, not a leap: it measures where OOM is unlikely.

        With checkpointing: just above the largest batch already implied to fit. A new precision:
        the largest batch another precision fits, where the two compare directly.
        """
        if strategy.checkpoint_segments or state.fit_max(strategy):
            return min(candidates)
        anchor = max((c.config.batch_size for c in state.ranked() if not c.config.checkpoint_segments), default=None)
        below = [b for b in candidates if anchor is not None and b <= anchor]
        return max(below) if below else min(candidates)

    def _refine_best(self, state: _State) -> Config | None:
        """Probe around the best batch, so a throughput peak below the memory limit is not missed:
        half the batch first (while halving keeps improving), then the untried neighbours."""
        ranked = state.ranked()
        if not ranked:
            return None
        best = ranked[0].config
        strategy = self.space.strategy_of(best)
        sizes = self.space.batch_sizes
        i = sizes.index(best.batch_size) if best.batch_size in sizes else None
        if i is None:
            return None
        probed_below = [c.config.batch_size for c in state.ranked()
                        if self.space.strategy_of(c.config) == strategy and c.config.batch_size < best.batch_size]
        half = max((b for b in sizes if b <= best.batch_size / 2), default=None)
        if half is not None and not any(b >= best.batch_size / 2.5 for b in probed_below):
            config = self.space.config(strategy, half)
            if not state.tried(config):
                return config
        for j in (i - 1, i + 1):
            if 0 <= j < len(sizes):
                config = self.space.config(strategy, sizes[j])
                if (not state.tried(config) and not state.implied_too_big(config)
                        and not state.model_says_too_big(config) and not (j > i and state.predicted_gamble(config))):
                    return config
        return None


class _State:
    """What the observations say, indexed for the planner's questions."""

    def __init__(self, space: SearchSpace, usable: float, observations: Sequence[Observation],
                 check_noise: bool = True, prediction: MemoryPrediction | None = None) -> None:
        self.space = space
        self.usable = usable
        self.observations = list(observations)
        self.by_config: dict[Config, list[Observation]] = defaultdict(list)
        for obs in self.observations:
            self.by_config[obs.config].append(obs)
        self._ranked: list[Candidate] | None = None
        self._memory: dict[tuple, Line | None] = {}
        self.noise = NoiseReading(self.observations, space.strategy_of)
        self.check_noise = check_noise
        self._measured_cache: list[Candidate] | None = None
        max_k = max(space.checkpoint_segments) if space.checkpoint_segments else 0
        self._max_k = max_k or 1
        self.predicted: CalibratedPrediction | None = (
            prediction.calibrate(self._done()) if prediction is not None else None)

    @property
    def any_observed(self) -> bool:
        return bool(self.observations)

    def tried(self, config: Config) -> bool:
        return config in self.by_config

    # --- feasibility ----------------------------------------------------------------------------
    def _done(self) -> list[Observation]:
        return [o for o in self.observations if o.status != "running"]

    def fit_max(self, strategy: Strategy) -> int | None:
        """Largest batch known (or implied) to fit: fits with as many or fewer checkpointed blocks."""
        fits = [
            o.config.batch_size for o in self._done()
            if _family(o.config) == strategy.family
            and o.config.checkpoint_segments <= strategy.checkpoint_segments
            and o.fits(self.usable)
        ]
        return max(fits) if fits else None

    def oom_min(self, strategy: Strategy) -> int | None:
        """Smallest batch known (or implied) too big: too big with as many or more blocks."""
        too_big = [
            o.config.batch_size for o in self._done()
            if _family(o.config) == strategy.family
            and o.config.checkpoint_segments >= strategy.checkpoint_segments
            and o.too_big(self.usable)
        ]
        return min(too_big) if too_big else None

    def data_ceiling(self) -> int | None:
        """Smallest batch the data could not feed (the function ran out of batches): every strategy
        stops below it, whatever its memory."""
        bound = [o.config.batch_size for o in self._done() if o.data_bound]
        return min(bound) if bound else None

    def implied_too_big(self, config: Config) -> bool:
        """Known not to run: too big for memory (implied by an OOM), or for the data."""
        bound = self.oom_min(self.space.strategy_of(config))
        ceiling = self.data_ceiling()
        return (bound is not None and config.batch_size >= bound) or (
            ceiling is not None and config.batch_size >= ceiling)

    def open_batches(self, strategy: Strategy) -> list[int]:
        """Batches whose feasibility is still unknown: between the largest fit and smallest OOM."""
        low = self.fit_max(strategy) or 0
        highs = [h for h in (self.oom_min(strategy), self.data_ceiling()) if h is not None]
        high = min(highs) if highs else None
        return [
            b for b in self.space.batch_sizes
            if b > low and (high is None or b < high) and not self.tried(self.space.config(strategy, b))
        ]

    def strategy_unusable(self, strategy: Strategy) -> bool:
        """A precision (sharding, compilation) that failed without ever running is not worth more
        probes: after one failure when another one runs (the failure is its own), else after two."""
        return (strategy.precision in self.unusable_precisions()
                or strategy.sharding in self._unusable("sharding", self.space.shardings)
                or strategy.compile in self._unusable("compile", self.space.compiles))

    def unusable_precisions(self) -> set[str]:
        return self._unusable("precision", self.space.precisions)

    def _unusable(self, field: str, values: Sequence[str]) -> set[str]:
        done = self._done()
        ran = {getattr(o.config, field) for o in done if o.status in ("ok", "oom")}
        out = set()
        for value in values:
            failures = sum(o.failed for o in done if getattr(o.config, field) == value)
            if value not in ran and failures >= (1 if ran else 2):
                out.add(value)
        return out

    # --- models -------------------------------------------------------------------------------
    def peaks(self, strategy: Strategy) -> list[tuple[float, float]]:
        return self._peaks(memory_key(strategy))

    def _peaks(self, key: tuple[str, str, int, bool]) -> list[tuple[float, float]]:
        return [
            (o.config.batch_size, float(o.peak_bytes)) for o in self._done()
            if o.status == "ok" and o.peak_bytes and memory_key(o.config) == key
        ]

    def model_margin(self, strategy: Strategy) -> float | None:
        """How far past the usable memory a prediction must land to be believed without a probe.

        Fitted on this strategy's own peaks: its residuals (at least 3%). Through one own peak with a
        borrowed slope: 15%. With no own peak: never believed.
        """
        own = self.peaks(strategy)
        line = fit_line(own)
        if line is not None:
            return max(0.03, 2 * line.max_rel_residual)
        return 0.15 if own else None

    def _prior_ratio(self, precision: str, k: int) -> float:
        ratio = _HALF_PRECISION_SLOPE if precision in ("bf16", "fp16") else 1.0
        return ratio * (1 - (1 - _FULL_CHECKPOINT_SLOPE) * k / self._max_k)

    def memory_model(self, strategy: Strategy) -> Line | None:
        """peak = a + m*batch for this precision, sharding and checkpoint level.

        Fitted from its own peaks when it has two batch sizes; otherwise borrowed from the nearest
        fitted strategy with a prior ratio (sharding splits the weights and optimizer state, not the
        activations: an unsharded intercept is an upper bound). Raised to agree with every OOM seen.
        """
        key = memory_key(strategy)
        if key in self._memory:
            return self._memory[key]
        own = self._peaks(key)
        line = fit_line(own)
        if line is None or line.slope <= 0:
            line = self._borrowed_line(key, own)
        if line is not None:
            line = self._respect_ooms(line, key)
        self._memory[key] = line
        return line

    def _borrowed_line(self, key: tuple[str, str, int, bool], own: list[tuple[float, float]]) -> Line | None:
        precision, sharding, k, compiled = key
        references = []
        for p in self.space.precisions:
            for h in self.space.shardings:
                for kk in self.space.checkpoint_segments:
                    for c in self.space.compiles:
                        ref = fit_line(self._peaks((p, h, kk, c)))
                        if ref is not None and ref.slope > 0:
                            distance = (p != precision) * 10 + (h != sharding) * 5 + (c != compiled) * 3 + abs(kk - k)
                            references.append((distance, p, kk, ref))
        if not references:
            return None
        _, p, kk, ref = min(references, key=lambda r: r[0])
        slope = ref.slope * self._prior_ratio(precision, k) / self._prior_ratio(p, kk)
        if own:  # one peak of its own: the borrowed intercept (weights, optimizer) through it
            b, peak = max(own)
            if peak > ref.intercept:
                return Line(ref.intercept, (peak - ref.intercept) / b)
            return Line(peak - slope * b, slope)
        return Line(ref.intercept, slope)

    def _respect_ooms(self, line: Line, key: tuple[str, str, int, bool]) -> Line:
        slope = line.slope
        for o in self._done():
            if o.status == "oom" and memory_key(o.config) == key:
                # It crossed at least the usable memory at this batch.
                slope = max(slope, (self.usable - line.intercept) / o.config.batch_size)
        return Line(line.intercept, slope, line.max_rel_residual, line.points)

    def model_says_too_big(self, config: Config) -> bool:
        """The measured memory line, beyond its margin, or the prediction, at its low end, says it
        does not fit."""
        if self.predicted is not None and self.predicted.too_big(config, self.usable):
            return True
        strategy = self.space.strategy_of(config)
        margin = self.model_margin(strategy)
        line = self.memory_model(strategy)
        return margin is not None and line is not None and line(config.batch_size) > self.usable * (1 + margin)

    def predicted_gamble(self, config: Config) -> bool:
        """Predicted neither to fit nor not to: probing it risks an OOM."""
        return (self.predicted is not None and self.predicted.peak(config) is not None
                and not self.predicted.safe(config, self.usable))

    def _points(self, strategy: Strategy) -> list[tuple[int, float]]:
        return [
            (c.config.batch_size, c.samples_per_s) for c in self._measured()
            if self.space.strategy_of(c.config) == strategy
        ]

    def estimate_throughput(self, strategy: Strategy, batch: int) -> float | None:
        """Best guess of samples/s at `batch`, or None when nothing comparable was measured.

        Own model with two sizes; with one, another strategy's curve through that point; with none,
        for checkpointing, its precision without checkpointing times the slowdown checkpointing
        showed elsewhere (it only adds compute); for sharding, the same strategy under DDP times the
        slowdown sharding showed elsewhere (it only adds communication).
        """
        own = self._points(strategy)
        model = fit_throughput(own)
        if model is not None and model.line.slope > 0:
            return min(model(batch), model.ceiling)
        reference = self._reference_model(strategy)
        if own:
            b1, t1 = own[0]
            if reference is None:
                return t1 if batch <= b1 else None
            return t1 * reference(batch) / reference(b1)
        if strategy.checkpoint_segments:
            base = replace(strategy, checkpoint_segments=0)
            estimate = self.estimate_throughput(base, batch)
            return estimate * self._checkpoint_slowdown(strategy) if estimate is not None else None
        if strategy.sharding != "ddp":
            estimate = self.estimate_throughput(replace(strategy, sharding="ddp"), batch)
            return estimate * self._sharding_slowdown(strategy.sharding) if estimate is not None else None
        if strategy.compile:  # no compiled probe yet: as fast as eager, until one says otherwise
            return self.estimate_throughput(replace(strategy, compile=False), batch)
        return None

    def _reference_model(self, strategy: Strategy) -> ThroughputModel | None:
        """The fitted curve of the most similar strategy (same precision first)."""
        best = None
        for other in self.space.strategies():
            if other == strategy:
                continue
            model = fit_throughput(self._points(other))
            if model is None or model.line.slope <= 0:
                continue
            distance = (other.precision != strategy.precision) * 100 + (other.sharding != strategy.sharding) * 50 + abs(
                other.checkpoint_segments - strategy.checkpoint_segments
            ) + (other.accumulation_steps != strategy.accumulation_steps) * 10 + (other.compile != strategy.compile) * 20
            if best is None or distance < best[0]:
                best = (distance, model)
        return best[1] if best else None

    def _checkpoint_slowdown(self, strategy: Strategy) -> float:
        """Smallest measured ratio (checkpointed / not) for as many or fewer blocks; 1.0 if unseen."""
        ratios = []
        for c in self._measured():
            k = c.config.checkpoint_segments
            if 0 < k <= strategy.checkpoint_segments:
                base = self.estimate_throughput(
                    replace(self.space.strategy_of(c.config), checkpoint_segments=0), c.config.batch_size)
                if base:
                    ratios.append(min(1.0, c.samples_per_s / base))
        return min(ratios) if ratios else 1 - _CHECKPOINT_SLOWDOWN * strategy.checkpoint_segments / self._max_k

    def _sharding_slowdown(self, sharding: str) -> float:
        """Smallest measured ratio (sharded / DDP at the same batch and settings); 1.0 if unseen."""
        ratios = []
        for c in self._measured():
            if c.config.sharding == sharding:
                base = self.estimate_throughput(replace(self.space.strategy_of(c.config), sharding="ddp"),
                                                c.config.batch_size)
                if base:
                    ratios.append(min(1.0, c.samples_per_s / base))
        return min(ratios) if ratios else 1.0

    def cannot_beat_best(self, strategy: Strategy, open_batches: list[int]) -> bool:
        """True when even the best open batch of `strategy` is bounded below the best so far."""
        ranked = self.ranked()
        if not ranked:
            return False
        if self.space.strategy_of(ranked[0].config) == strategy and len(self._points(strategy)) < 3:
            return False  # two noisy points of the leading strategy cannot say its curve has turned
        memory = self.memory_model(strategy)
        reachable = [b for b in open_batches if memory is None or memory(b) <= self.usable]
        largest = max(reachable) if reachable else min(open_batches)
        estimate = self.estimate_throughput(strategy, largest)
        return estimate is not None and estimate * _PRUNE_SLACK < ranked[0].samples_per_s

    # --- results --------------------------------------------------------------------------------
    def _measured(self) -> list[Candidate]:
        """Every config that ran its steps (inside the headroom or not), with median throughput.

        Suspect measurements (see _noise.py) are left out until a recheck resolves them, so they
        neither win nor bound other strategies; unless nothing else was measured."""
        if self._measured_cache is not None:
            return self._measured_cache
        trusted = [c for c in self.by_config if not (self.check_noise and self.noise.is_unresolved(c))]
        if not any(o.status == "ok" for c in trusted for o in self.by_config[c]):
            trusted = list(self.by_config)
        out = []
        for config in trusted:
            obs = self.by_config[config]
            ok = [o for o in obs if o.status == "ok" and o.samples_per_s]
            if ok:
                peaks = [o.peak_bytes for o in ok if o.peak_bytes is not None]
                rate = self.noise.rate(config) if self.check_noise else statistics.median(o.samples_per_s for o in ok)
                out.append(Candidate(config, rate, max(peaks) if peaks else None, len(ok),
                                     any(o.tight for o in ok)))
        self._measured_cache = out
        return out

    def ranked(self) -> list[Candidate]:
        if self._ranked is None:
            feasible = [
                c for c in self._measured()
                if not any(o.too_big(self.usable) or o.failed for o in self.by_config[c.config])
            ]
            feasible.sort(key=lambda c: -c.samples_per_s)
            if feasible:
                top = feasible[0].samples_per_s
                ties = [c for c in feasible if c.samples_per_s >= top * (1 - TIE_TOLERANCE)]
                rest = [c for c in feasible if c not in ties]
                ties.sort(key=lambda c: (c.tight, c.peak_bytes or 0, -c.samples_per_s))
                feasible = ties + rest
            self._ranked = feasible
        return self._ranked


def _family(config: Config) -> tuple[str, str, bool]:
    return config.precision, config.sharding, config.compile

