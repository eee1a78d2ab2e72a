"""What the observations say fits, and what cannot: memory is monotone within one precision, sharding
and compilation (peak rises with micro-batch, falls with more checkpointing: `needs_no_more_memory`,
and accumulating needs no less than one micro-batch a step: `holds_gradients`), so one OOM or one fit
implies the answer for many configs that are then never probed; the data is a ceiling too."""

from __future__ import annotations

from collections.abc import Sequence

from autofit.config import KNOB, Config
from autofit.knobs import Knob
from autofit.planner._observation import Observation
from autofit.planner._recompute import ORDERED_BY_RULES, holds_gradients, needs_no_more_memory
from autofit.planner._search_space import STRATEGY_KNOBS, SearchSpace, Strategy


class Feasibility:
    """Which batches are known (or implied) to fit, which too big, which still open."""

    def __init__(self, space: SearchSpace, usable: float, observations: Sequence[Observation]) -> None:
        self.space = space
        self.usable = usable
        self._tried = {o.config for o in observations}
        self.done = [o for o in observations if o.status != "running"]
        """The observations of finished probes (not those running now)."""
        self.running = {o.config for o in observations if o.status == "running"}
        """The configs being probed now."""

    def tried(self, config: Config) -> bool:
        """Probed, or being probed now."""
        return config in self._tried

    def fit_max(self, strategy: Strategy) -> int | None:
        """Largest batch of `strategy` known (or implied) to fit (see `implies_fit`)."""
        fits = [o.config.size for o in self.done
                if o.fits(self.usable) and implies_fit(o.config, self.space.config(strategy, o.config.size))]
        return max(fits) if fits else None

    def oom_min(self, strategy: Strategy) -> int | None:
        """Smallest batch of `strategy` known (or implied) too big (see `implies_too_big`)."""
        too_big = [o.config.size for o in self.done
                   if o.too_big(self.usable) and implies_too_big(o.config, self.space.config(strategy, o.config.size))]
        return min(too_big) if too_big else None

    def data_ceiling(self) -> int | None:
        """Smallest batch the data could not feed (the function ran out of batches): every strategy
        stops below it, whatever its memory."""
        bound = [o.config.size for o in self.done if o.data_bound]
        return min(bound) if bound else None

    def implied_fit(self, config: Config) -> bool:
        return any(o.fits(self.usable) and implies_fit(o.config, config) for o in self.done)

    def implied_too_big(self, config: Config) -> bool:
        """Known not to run: too big for memory (implied by an OOM, or beyond a fit whose measured steps needed the
        allocator's retries: the edge, where a larger one runs slower if it runs), or for the data."""
        ceiling = self.data_ceiling()
        return (any((o.too_big(self.usable) or (o.tight and config.size > o.config.size))
                    and implies_too_big(o.config, config) for o in self.done)
                or (ceiling is not None and config.size >= ceiling))

    def open_batches(self, strategy: Strategy) -> list[int]:
        """Batches whose feasibility is still unknown: neither probed nor implied to fit or not (within
        one accumulation, those between the largest fit and the smallest OOM), nor implied too slow."""
        configs = [self.space.config(strategy, b) for b in self.space.batch_sizes]
        return [c.size for c in configs if not self.tried(c) and not self.implied_fit(c)
                and not self.implied_too_big(c) and not self.implied_too_slow(c)]

    def implied_too_slow(self, config: Config) -> bool:
        """At a fixed global batch, a probe that stalled at micro-batch b (a micro-batch made no progress for
        the stall limit) says no smaller micro-batch of its strategy is worth a probe: its step holds more
        micro-batches, each no faster per sample. Only a stall, and only within its strategy: a start that
        timed out is compilation or the script's own evaluation, which grow with b, if anything (a probe
        runs 4 micro-batches at most, so a smaller b is no longer a longer probe); and another precision,
        compile or checkpointing runs at speeds of its own. A timeout says nothing of memory, and nothing
        against a larger micro-batch."""
        if not self.space.global_batch:
            return False
        strategy = self.space.strategy_of(config)
        return any(o.timed_out and o.stalled and config.size < o.config.size
                   and self.space.strategy_of(o.config) == strategy for o in self.done)

    def strategy_unusable(self, strategy: Strategy) -> bool:
        """A precision (sharding, compilation, selective checkpointing: any knob's value) that failed without
        ever running is not worth more probes: after one failure when another one runs (the failure is its
        own), else after two. An OOM counts as running: it says the memory, not the code, stopped it; a timeout is no
        failure (`Observation.failed`): it says how long the config takes, never that it cannot run."""
        return any(k.acting(strategy) in self.unusable(k) for k in STRATEGY_KNOBS if k.kind is not int)

    def unusable(self, knob: Knob) -> set:
        """The values of a knob of the space (not a count: a precision, a sharding, compiling) that failed
        without running; a knob that acts only beside another (`needs`) has its default as the base, never
        unusable (full checkpointing, beside selective)."""
        return self._unusable(knob.name, [v for v in self.space.values_of(knob.name)
                                          if not (knob.needs and v == knob.default)])

    def unusable_precisions(self) -> set[str]:
        return self.unusable(KNOB["precision"])

    def unusable_policies(self) -> set[str]:
        """{"selective"} once selective checkpointing failed without running ("full" is the base)."""
        return self.unusable(KNOB["checkpoint_policy"])

    def _unusable(self, field: str, values: Sequence[str]) -> set[str]:
        done = self.done
        ran = {getattr(o.config, field) for o in done if o.status in ("ok", "oom")}
        out = set()
        for value in values:
            failures = sum(o.failed for o in done if getattr(o.config, field) == value)
            if value not in ran and failures >= (1 if ran else 2):
                out.add(value)
        return out


def family(config: Config) -> tuple:
    """The configs whose memory compares by batch, checkpointing and accumulation alone: every other knob
    of a strategy the same (`Strategy.family`)."""
    return tuple(getattr(config, k.name) for k in STRATEGY_KNOBS if k.name not in ORDERED_BY_RULES)


def implies_fit(fit: Config, config: Config) -> bool:
    """A fit at `fit` says `config` fits: same family, no larger micro-batch, checkpointing that needs no
    more memory, and gradients held through a forward only where `fit` held them too."""
    return (family(fit) == family(config) and config.size <= fit.size
            and needs_no_more_memory(config, fit) and holds_gradients(config) <= holds_gradients(fit))


def implies_too_big(too_big: Config, config: Config) -> bool:
    """Too big at `too_big` says `config` is too: `implies_fit` the other way round."""
    return implies_fit(config, too_big)
