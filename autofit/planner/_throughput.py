"""What the planner believes about a strategy's throughput (`Observation.rate`: samples/s, or real tokens/s
by tokens, whose micro-batches hold real tokens in proportion to their cap): its own fitted curve (time per
micro-batch = c0 + c1 x size) where it has two measured sizes, else one measured point carried along the
most similar strategy's curve, else the strategy it only adds work to (no checkpointing or other memory lever,
DDP, eager) slowed as much as that addition was seen to slow others. Used to bound what a strategy can reach."""

from __future__ import annotations

from autofit.planner._models import ThroughputModel, fit_throughput
from autofit.planner._observation import is_variant
from autofit.planner._ranking import Ranking
from autofit.planner._recompute import OTHER_LEVERS, recomputes_no_more
from autofit.planner._search_space import SearchSpace, Strategy

#: Prior slowdown of checkpointing every block (it recomputes the forward pass); measured values win.
_CHECKPOINT_SLOWDOWN = 0.2
#: The same under selective checkpointing, which recomputes only the cheap ops (no matmul).
_SELECTIVE_SLOWDOWN = 0.05
#: Prior slowdown of another memory lever (activation offload: host copies that overlap the step, issue 51's goal
#: of 15% at most; where they do not, its first probe measures more, and its measured ratio wins).
_OTHER_LEVER_SLOWDOWN = 0.15


class ThroughputModels:
    """Throughput estimates of every strategy from the trusted measurements of one reading."""

    def __init__(self, space: SearchSpace, ranking: Ranking) -> None:
        self.space = space
        self.ranking = ranking
        self._max_k = max(space.values_of("checkpoint_segments")) or 1

    def _measured(self) -> list:
        """The trusted measurements, less the loader variants (run.loader) and the squares variants: they
        speed up the input, or batch the short samples larger, not the steps a strategy's curve describes,
        and would bend it."""
        return [c for c in self.ranking.measured() if not is_variant(c.config)]

    def points(self, strategy: Strategy) -> list[tuple[int, float]]:
        """(size, rate) of the strategy's trusted measurements."""
        return [
            (c.config.size, c.rate) for c in self._measured()
            if self.space.strategy_of(c.config) == strategy
        ]

    def estimate(self, strategy: Strategy, batch: int) -> float | None:
        """Best guess of the rate at `batch` (a size), or None when nothing comparable was measured.

        Own model with two sizes; with one, another strategy's curve through that point; with none,
        for checkpointing, its precision without checkpointing times the slowdown checkpointing
        showed elsewhere (it only adds compute); for sharding, the same strategy under DDP times the
        slowdown sharding showed elsewhere (it only adds communication).
        """
        own = self.points(strategy)
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
            base = strategy.replaced(checkpoint_segments=0, checkpoint_policy="full")
            estimate = self.estimate(base, batch)
            return estimate * self._checkpoint_slowdown(strategy) if estimate is not None else None
        levers = [k for k in OTHER_LEVERS if getattr(strategy, k.name) != k.default]
        if levers:  # it only adds work to the same strategy without them
            estimate = self.estimate(strategy.replaced(**{k.name: k.default for k in levers}), batch)
            return estimate * self._lever_slowdown(levers) if estimate is not None else None
        if strategy.sharding != "ddp":
            estimate = self.estimate(strategy.replaced(sharding="ddp"), batch)
            return estimate * self._sharding_slowdown(strategy.sharding) if estimate is not None else None
        if strategy.compile:  # no compiled probe yet: as fast as eager, until one says otherwise
            return self.estimate(strategy.replaced(compile=False), batch)
        return None

    def _reference_model(self, strategy: Strategy) -> ThroughputModel | None:
        """The fitted curve of the most similar strategy (same precision first)."""
        best = None
        for other in self.space.strategies():
            if other == strategy:
                continue
            model = fit_throughput(self.points(other))
            if model is None or model.line.slope <= 0:
                continue
            distance = (other.precision != strategy.precision) * 100 + (other.sharding != strategy.sharding) * 50 + abs(
                other.checkpoint_segments - strategy.checkpoint_segments
            ) + (other.accumulation_steps != strategy.accumulation_steps) * 10 + (other.compile != strategy.compile) * 20
            distance += other.checkpoint_policy != strategy.checkpoint_policy
            if best is None or distance < best[0]:
                best = (distance, model)
        return best[1] if best else None

    def _checkpoint_slowdown(self, strategy: Strategy) -> float:
        """Smallest measured ratio (checkpointed / not) of checkpointing that recomputes no more (as
        many or fewer blocks; selective for full); a prior if unseen."""
        ratios = []
        for c in self._measured():
            if c.config.checkpoint_segments and recomputes_no_more(c.config, strategy):
                base = self.estimate(self.space.strategy_of(c.config).replaced(checkpoint_segments=0,
                                             checkpoint_policy="full"), c.config.size)
                if base:
                    ratios.append(min(1.0, c.rate / base))
        prior = _SELECTIVE_SLOWDOWN if strategy.checkpoint_policy == "selective" else _CHECKPOINT_SLOWDOWN
        return min(ratios) if ratios else 1 - prior * strategy.checkpoint_segments / self._max_k

    def _lever_slowdown(self, levers: list) -> float:
        """Smallest measured ratio (with `levers` set / without, at the same batch and settings); a prior if unseen."""
        ratios = []
        for c in self._measured():
            if all(getattr(c.config, k.name) != k.default for k in levers):
                base = self.estimate(self.space.strategy_of(c.config).replaced(**{k.name: k.default for k in levers}),
                                     c.config.size)
                if base:
                    ratios.append(min(1.0, c.rate / base))
        return min(ratios) if ratios else 1 - _OTHER_LEVER_SLOWDOWN

    def _sharding_slowdown(self, sharding: str) -> float:
        """Smallest measured ratio (sharded / DDP at the same batch and settings); 1.0 if unseen."""
        ratios = []
        for c in self._measured():
            if c.config.sharding == sharding:
                base = self.estimate(self.space.strategy_of(c.config).replaced(sharding="ddp"),
                                     c.config.size)
                if base:
                    ratios.append(min(1.0, c.rate / base))
        return min(ratios) if ratios else 1.0
