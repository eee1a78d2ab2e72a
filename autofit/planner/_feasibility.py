"""What the observations say fits, and what cannot: memory is monotone within one precision, sharding
and compilation (peak rises with micro-batch, falls with more checkpointing: `needs_no_more_memory`),
so one OOM or one fit implies the answer for many configs that are then never probed; the data is a
ceiling too."""

from __future__ import annotations

from collections.abc import Sequence

from autofit.config import Config
from autofit.planner._observation import Observation
from autofit.planner._space import SearchSpace, Strategy, checkpoint_policy, needs_no_more_memory


class Feasibility:
    """Which batches are known (or implied) to fit, which too big, which still open."""

    def __init__(self, space: SearchSpace, usable: float, observations: Sequence[Observation]) -> None:
        self.space = space
        self.usable = usable
        self._tried = {o.config for o in observations}
        self.done = [o for o in observations if o.status != "running"]
        """The observations of finished probes (not those running now)."""

    def tried(self, config: Config) -> bool:
        """Probed, or being probed now."""
        return config in self._tried

    def fit_max(self, strategy: Strategy, holds: bool | None = None) -> int | None:
        """Largest batch known (or implied) to fit: fits with checkpointing that needs as much memory or
        more (as many or fewer checkpointed blocks, ...), and with gradients held if the configs asked
        about hold them (`holds`; None: any of the strategy's may): a fit without accumulation says
        nothing of one with it."""
        holds = self._may_hold(strategy) if holds is None else holds
        fits = [
            o.config.batch_size for o in self.done
            if family(o.config) == strategy.family
            and needs_no_more_memory(strategy, o.config)
            and (holds_gradients(o.config) or not holds)
            and o.fits(self.usable)
        ]
        return max(fits) if fits else None

    def oom_min(self, strategy: Strategy, holds: bool | None = None) -> int | None:
        """Smallest batch known (or implied) too big: too big with checkpointing that needs as little
        memory or less (as many or more blocks, ...), and holding no more gradients than the configs
        asked about (`holds`; None: what every config of the strategy holds): an OOM at (G/2, acc=2),
        whose gradients sat beside the next forward, rules nothing out at (G, acc=1)."""
        holds = self._always_holds(strategy) if holds is None else holds
        too_big = [
            o.config.batch_size for o in self.done
            if family(o.config) == strategy.family
            and needs_no_more_memory(o.config, strategy)
            and (holds or not holds_gradients(o.config))
            and o.too_big(self.usable)
        ]
        return min(too_big) if too_big else None

    @staticmethod
    def _may_hold(strategy: Strategy) -> bool:
        return strategy.accumulation_steps is None or strategy.accumulation_steps > 1

    @staticmethod
    def _always_holds(strategy: Strategy) -> bool:
        return strategy.accumulation_steps is not None and strategy.accumulation_steps > 1

    def data_ceiling(self) -> int | None:
        """Smallest batch the data could not feed (the function ran out of batches): every strategy
        stops below it, whatever its memory."""
        bound = [o.config.batch_size for o in self.done if o.data_bound]
        return min(bound) if bound else None

    def implied_too_big(self, config: Config) -> bool:
        """Known not to run: too big for memory (implied by an OOM), or for the data."""
        bound = self.oom_min(self.space.strategy_of(config), holds_gradients(config))
        ceiling = self.data_ceiling()
        return (bound is not None and config.batch_size >= bound) or (
            ceiling is not None and config.batch_size >= ceiling)

    def open_batches(self, strategy: Strategy) -> list[int]:
        """Batches whose feasibility is still unknown: between the largest fit and smallest OOM (of
        the configs that hold gradients as each batch's does)."""
        out = []
        for b in self.space.batch_sizes:
            config = self.space.config(strategy, b)
            holds = holds_gradients(config)
            low = self.fit_max(strategy, holds) or 0
            highs = [h for h in (self.oom_min(strategy, holds), self.data_ceiling()) if h is not None]
            if b > low and (not highs or b < min(highs)) and not self.tried(config):
                out.append(b)
        return out

    def strategy_unusable(self, strategy: Strategy) -> bool:
        """A precision (sharding, compilation, selective checkpointing) that failed without ever
        running is not worth more probes: after one failure when another one runs (the failure is its
        own), else after two. An OOM is running: only failures that are not memory count."""
        return (strategy.precision in self.unusable_precisions()
                or strategy.sharding in self._unusable("sharding", self.space.shardings)
                or strategy.compile in self._unusable("compile", self.space.compiles)
                or checkpoint_policy(strategy) in self._unusable("checkpoint_policy", ("selective",)))

    def unusable_precisions(self) -> set[str]:
        return self._unusable("precision", self.space.precisions)

    def _unusable(self, field: str, values: Sequence[str]) -> set[str]:
        done = self.done
        ran = {getattr(o.config, field) for o in done if o.status in ("ok", "oom")}
        out = set()
        for value in values:
            failures = sum(o.failed for o in done if getattr(o.config, field) == value)
            if value not in ran and failures >= (1 if ran else 2):
                out.add(value)
        return out


def holds_gradients(config: Config) -> bool:
    """Accumulation keeps a micro-batch's gradients beside the next one's activations: at one micro-batch
    such a config needs at least the memory of one without (whatever its count), never less."""
    return config.accumulation_steps > 1


def family(config: Config) -> tuple[str, str, bool]:
    """The configs whose memory compares by batch and checkpointing alone."""
    return config.precision, config.sharding, config.compile
