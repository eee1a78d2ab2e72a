"""Rule 12 of the planner: where memory binds, the memory levers climb first.

Memory binds a strategy's climb where the next size above its largest fit (its smallest size, where nothing of it
fits) is known too big (an OOM, a peak inside the headroom: rule 1) or may not fit (the estimator's range crosses the
usable memory, or its best guess, else the memory line fitted from the probes, is over it: rules 2 and 7). There the
levers (autofit.knobs' `lever`: more checkpointed blocks, the full policy, then activation offload where the device
runs it) are probed at that next size before any probe goes to the edge itself: the one estimated to keep the most
throughput (the least recompute or copying) among those the memory prediction says fit there even at its high end;
where nothing predicts any (nothing measured to borrow a line from), the one that saves the most. A lever then
climbs as any strategy does, and where memory binds it in turn, the levers beyond it climb at its next size.

A lever is probed only where memory binds the strategy without levers: where the batch range, the global batch or
the data ends the climb first, a lever only adds work at a size that fits without it (the H200's HF search spent its
last probe on offload at b=32 with 92 GiB free, its micro-batch held by the global batch)."""

from __future__ import annotations

from collections.abc import Callable

from autofit.config import Config
from autofit.planner._feasibility import Feasibility
from autofit.planner._memory_model import MemoryModels
from autofit.planner._recompute import OTHER_LEVERS, needs_no_more_memory, without_levers
from autofit.planner._search_space import SearchSpace, Strategy
from autofit.planner._throughput import ThroughputModels


#: A lever is judged by the throughput it could reach this far above the edge at most (rule 2's leap).
_MAX_REACH = 4


class Levers:
    """Where memory binds each strategy of a space, and which lever to probe there, on one reading of the
    observations (the planner's `_State`)."""

    def __init__(self, space: SearchSpace, feasible: Feasibility, memory: MemoryModels,
                 throughput: ThroughputModels) -> None:
        self.space = space
        self.feasible = feasible
        self.memory = memory
        self.throughput = throughput

    def edge(self, strategy: Strategy) -> int | None:
        """The size at which memory stops `strategy`'s climb: the next size above its largest fit (its smallest,
        where none fits) when that one is known too big for memory or may not fit (see the module's docstring). None
        where the climb is still open there, or where the batch range, the global batch or the data ends it first."""
        top = self.feasible.fit_max(strategy)
        above = [b for b in self.space.batch_sizes if top is None or b > top]
        ceiling = self.feasible.data_ceiling()
        if not above or (ceiling is not None and above[0] >= ceiling):
            return None
        config = self.space.config(strategy, above[0])
        bound = (self.feasible.implied_too_big(config) or self.memory.likely_too_big(config)
                 or self.memory.may_not_fit(config))
        return above[0] if bound else None

    def binds(self, strategy: Strategy) -> bool:
        """Whether memory binds the climb of `strategy` without its levers: only then is a lever worth a probe."""
        return self.edge(without_levers(strategy)) is not None

    def beyond(self, strategy: Strategy) -> list[Strategy]:
        """The space's strategies that pull levers `strategy` does not (its own knobs otherwise), less those that
        rule 1 says need as much memory as it (fewer blocks, or selective for full)."""
        base = without_levers(strategy)
        return [s for s in self.space.strategies() if s != strategy and without_levers(s) == base
                and not (s.family == strategy.family and needs_no_more_memory(strategy, s))]

    def next_config(self, strategy: Strategy, worth: Callable[[Strategy], bool]) -> Config | None:
        """The lever to probe at the edge where memory binds `strategy` (see the module's docstring); None where
        memory does not bind it, where a lever already fits there or above (its own climb goes on) or is being
        probed, or where no lever is predicted to fit there, or could beat the best (`worth`)."""
        edge = self.edge(strategy)
        if edge is None:
            return None
        levers = [s for s in self.beyond(strategy) if not self.feasible.strategy_unusable(s)]
        if any((self.feasible.fit_max(s) or 0) >= edge for s in levers) or any(
                self.space.strategy_of(c) in levers and c.size >= edge for c in self.feasible.running):
            return None
        open_ = [c for c in (self.space.config(s, edge) for s in levers)
                 if not self.feasible.tried(c) and not self.feasible.implied_too_big(c)
                 and not self.memory.says_too_big(c)]
        sure = {c: self.memory.fits_for_sure(c) for c in open_}
        if any(sure.values()):
            ordered = sorted((c for c in open_ if sure[c]), key=lambda c: self._cost(c, edge))
        elif all(v is None for v in sure.values()):
            ordered = sorted(open_, key=_saving_most)  # nothing predicts any: the one that saves the most
        else:
            return None  # each one predicted not to fit: memory cannot be saved enough here
        return next((c for c in ordered if worth(self.space.strategy_of(c))), None)

    def _cost(self, config: Config, edge: int) -> tuple:
        """A lever's order, best first: checkpointing before another lever (activation offload, whose copies may
        cost most of a step where they do not overlap), then the throughput it is estimated to reach (at the
        largest size its memory is predicted to fit, _MAX_REACH x the edge at most: a launch-bound device gains
        more from the size than it loses to recompute, a saturated one does not), then the fewest blocks, selective
        before full."""
        strategy = self.space.strategy_of(config)
        reach = max((b for b in self.space.batch_sizes if edge <= b <= edge * _MAX_REACH
                     and not self.memory.likely_too_big(self.space.config(strategy, b))), default=edge)
        estimate = self.throughput.estimate(strategy, reach)
        return (sum(getattr(config, k.name) != k.default for k in OTHER_LEVERS), -(estimate or 0.0),
                config.checkpoint_segments, config.checkpoint_policy == "full")


def _saving_most(config: Config) -> tuple:
    """Most blocks checkpointed, under the full policy, then the fewest other levers: an expert's first try where
    nothing is known of the levers' memory."""
    return (-config.checkpoint_segments, config.checkpoint_policy != "full",
            sum(getattr(config, k.name) != k.default for k in OTHER_LEVERS))

