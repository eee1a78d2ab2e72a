"""autofit's search strategy: which config to probe next, from what the probes so far say.

Pure logic over `Observation`s (no Optuna, no torch), so the live search, parallel workers and the
benchmark's replays all run the same decisions. The rules, in order:

1. Memory is monotone: within one precision and sharding, peak memory rises with micro-batch and
   falls with more checkpointing: more checkpointed blocks under one policy, and at as many blocks or
   more, full checkpointing below selective below none (selective on more blocks than full compares
   with it neither way). An OOM (or a peak inside the headroom) at batch b implies the same at every
   larger batch with checkpointing that needs as much memory or more; a fit implies fits below, and
   with checkpointing that needs as little or less. Implied answers are never probed.
2. A memory model per strategy (peak = a + m*batch, fitted from the peaks measured, bounded below by
   the OOMs) jumps straight to the largest batch predicted to fit, instead of doubling from 1. When
   the model, fitted on two or more points, predicts that the next batch would cross the usable
   memory by more than its own error, that batch is not probed; with one point, a step up goes no
   further than usable x b / peak(b), which certainly fits (under an OOM too). A batch whose best guess (the
   line, or the estimator's middle) is over the usable memory is a gamble taken only where it could be
   _GAMBLE_GAIN faster than the best, and after the memory levers (rule 12). The pilot (the first probe: the space's
   first strategy, the expected best precision, at a memory-scaled guess of its batch) climbs so (or by
   rule 7) to its memory edge; only then is each other precision probed once, at the largest batch the
   pilot's fits: at a small batch a GPU's step is launch-bound and every precision reads alike, while
   batch moves throughput 10-100x and precision 1.1-1.5x. While the top of a climb measured at most half
   the usable memory and throughput still rises, the step at least doubles, whatever the prediction's
   high end (`_climb_floor`); nearer the edge that least step is what the measured peak certainly fits. A token
   function's pilot by samples is its cap's memory point (`_pilot_caps`): the first cap is sized from it.
3. A throughput model per strategy (time per micro-batch = c0 + c1*batch) bounds what a strategy can
   reach: strategies (and the rest of a bracket) that cannot beat the best so far are skipped;
   checkpointing, which only adds compute, is bounded by its precision's model without it (and, once
   measured, by checkpointing that recomputes less: fewer blocks, or selective for full), and a
   sharded strategy (FSDP2, which only adds communication) by the same strategy under DDP.
4. Throughput is noisy and not always monotone: the neighbours of the best batch are probed before
   the search ends, climbing while they improve (the one above only where its best guess fits); a config that
   does not fit is never rechecked.
5. (The A/B that names the winner: _ab.py, and the search's confirm phase.)
6. (The data's ceiling: _feasibility.py.)
7. With the memory estimator's prediction (see _prediction.py), from the first probe on: each
   strategy starts at the largest batch predicted to fit at the high end of its range, a batch
   whose low end does not fit is never probed, and one in between only if it could be faster.
8. When the function offers run.loader() and the leader waited for its data, the leader is probed
   with more loader workers, deeper prefetch and pinned memory, last (see _loader_rule.py). Rules 1-7 work
   with the loader as the script declares it.
9. By tokens, the leader is then probed with larger token caps under a squares cap at its worst batch's,
   so that short batches hold more tokens (per-length caps, see _squares_rule.py).
10. A timeout is a fact about speed: it makes nothing unusable, and at a fixed global batch a stall rules out the
   smaller micro-batches of its strategy; with nothing measured, a timed-out config is probed again (_retry_timed_out).
11. A knob that changes a step's speed and not what fits (a memory format), where the function offers it, is
   tried on the fastest config after the loader's turn, each of its values kept where faster (_variant_rule.py).
12. Where memory binds the leader's strategy (its next batch is too big or may not fit), a memory lever (more
   checkpointed blocks, the full policy, then activation offload) is probed at that next batch before the batch
   itself, one predicted to fit there, and a lever that fits climbs before any other strategy; a lever is
   probed only where memory binds the strategy without levers, never where the range or the global batch ends
   its climb (_lever_rule.py).

The numbers are those of docs/reference/planner.md.
The planner decides; what the observations say is read by its parts, once per decision (`_State`):
what fits (_feasibility.py, rule 1), the memory lines and the calibrated prediction
(_memory_model.py, rules 2 and 7), the throughput estimates (_throughput.py, rule 3), where memory binds
and which lever is next (_lever_rule.py, rule 12), the noise reading (_noise.py) and the ranking (_ranking.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from autofit.config import KNOB, SHARDINGS, Config
from autofit.planner._ab import ABPlan, contenders, entrants, within_noise
from autofit.planner._feasibility import Feasibility
from autofit.planner._lever_rule import Levers
from autofit.planner._loader_rule import leader, next_loader_config
from autofit.planner._memory_model import MemoryModels
from autofit.planner._models import Line
from autofit.planner._noise import NoiseReading
from autofit.planner._observation import Observation, compute_variant
from autofit.planner._prediction import CalibratedPrediction, MemoryPrediction, PeakRange
from autofit.planner._ranking import Candidate, Ranking
from autofit.planner._recompute import pulls_a_lever
from autofit.planner._search_space import SearchSpace, Strategy
from autofit.planner._squares_rule import next_squares_config
from autofit.planner._throughput import ThroughputModels
from autofit.planner._variant_rule import next_variant_config

#: A skipped strategy's optimistic bound must fall this far below the best so far.
_PRUNE_SLACK = 1.03
#: The strategy knobs `Planner._order` names; any other (a memory knob added later) is tried once those at
#: their defaults are: its strategies after the others of their compilation.
_ORDERED_BY_NAME = ("precision", "checkpoint_segments", "checkpoint_policy", "accumulation_steps", "sharding",
                    "compile")
#: A config predicted to maybe not fit is probed only if it could be this much faster than the best:
#: an OOM probe costs a probe, and a batch near the memory limit is rarely much faster.
_GAMBLE_GAIN = 1.10
_PILOT_BATCH = 4
#: Where the device's memory is large, the pilot starts at about one sample per this many bytes of it (a
#: memory-scaled guess: GPT-2 small at 1,024 tokens takes about 1 GiB a sample in bf16, 2 in fp32), not at
#: _PILOT_BATCH: on an 80 GB GPU a micro-batch of 4 is launch-bound and tells little of what fits.
_PILOT_BYTES_PER_SAMPLE = 2 * 2**30
#: Rechecks of suspect measurements always allowed, whatever the number of explore probes.
_MIN_RECHECKS = 4
_MAX_LEAP = 4
_PILOT_JUMP = 4
#: With nothing measured, a config that timed out is probed this many times at most.
_TIMEOUT_TRIES = 2


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
        early = self._first_of_each_precision(state)
        if early is not None:
            return early
        lever = self._leading_lever(state)
        if lever is not None:
            return lever
        for strategy in self._order(state):
            if state.feasible.strategy_unusable(strategy):
                continue
            proposal = self._next_in_strategy(state, strategy)
            if proposal is not None:
                return proposal
        refined = _around_the_best(self.space, state)
        if refined is not None:
            return refined
        ranked = state.ranking.ranked()
        return (next_loader_config(self.space.loader, ranked, state.observations)
                or next_variant_config(self.space.variants, ranked, state.observations)
                or next_squares_config(self.space, leader(ranked), ranked, state.observations, self.usable)
                or _retry_timed_out(state))

    def leader_can_climb(self, observations: Sequence[Observation]) -> bool:
        """Whether the leader is the largest batch of its strategy that fits and a larger one is still open
        (not probed, not ruled out by the memory models): its climb has not reached the memory edge."""
        return _can_climb(self.space, self._state(observations))

    def ranked(self, observations: Sequence[Observation]) -> list[Candidate]:
        """Feasible configs, best first: throughput, with near-ties broken toward configs that did
        not need allocator retries, then toward lower peak."""
        return self._state(observations).ranking.ranked()

    def best(self, observations: Sequence[Observation]) -> Config | None:
        ranked = self.ranked(observations)
        return ranked[0].config if ranked else None

    def unusable_precisions(self, observations: Sequence[Observation]) -> set[str]:
        return self._state(observations).feasible.unusable_precisions()

    def unusable_policies(self, observations: Sequence[Observation]) -> set[str]:
        """Checkpoint policies abandoned: they failed without ever running."""
        return self._state(observations).feasible.unusable_policies()

    def memory_models(self, observations: Sequence[Observation]) -> dict[Strategy, Line]:
        """The fitted memory line (peak = a + m x batch) of every strategy that has one, as the
        planner uses it to decide what fits (the report draws them)."""
        state = self._state([o for o in observations if o.status != "running"])
        tried = {self.space.strategy_of(o.config) for o in state.observations}
        models = {s: state.memory.line(s) for s in self.space.strategies() if s in tried}
        return {s: line for s, line in models.items() if line is not None}

    def memory_line(self, strategy: Strategy, observations: Sequence[Observation]) -> Line | None:
        """The memory line the planner decides with for one strategy (its own, or one borrowed)."""
        return self._state(observations).memory.line(strategy)

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
        # A config that does not fit never wins nor bounds anything: its speed needs no second probe (one over the
        # headroom read fastest of its precision and was probed again, on the memory stand-in).
        waiting = [c for c in state.noise.unresolved() if c not in running and state.ranking.fits(c)]
        if waiting:
            return max(waiting, key=state.noise.rate)
        if self.next(observations) is not None:
            return None  # leaders are confirmed once exploring is done
        leaders = [c for c in state.noise.unconfirmed_leaders(state.ranking.fits) if c not in running]
        return leaders[0] if leaders else None

    def contenders(self, observations: Sequence[Observation]) -> list[Config]:
        """The close contenders to measure again, longer, before a winner is named, best first: the first
        three of the ranking as it stood before any remeasurement within the noise of the best (its
        ranking margin, see `within_noise`) and measured once then, remeasured not yet; none when the
        leader has no contender (its confirmation measures it). None is decided on one probe.

        First come the suspect measurements (see _noise.py) that read faster than the leader: a search that
        ended before their recheck (--trials, the budget) would otherwise leave them out and name a slower
        config (a 3x slower one, once, on a suspect's erratic steps); a second probe settles them."""
        before = [o for o in observations if o.phase != "remeasure"]
        remeasured = {o.config for o in observations if o.phase == "remeasure"}
        state = self._state(before)
        ranked = state.ranking.ranked()
        faster: list[Config] = []
        if self.check_noise and ranked:
            top = ranked[0].rate
            faster = sorted((c for c in state.noise.unresolved() if c not in remeasured and state.ranking.fits(c)
                             and state.noise.rate(c) > top), key=state.noise.rate, reverse=True)
        return faster + [c for c in contenders(within_noise(ranked, state.ranking.contender_margin), remeasured)
                         if c not in faster]

    def ab_entrants(self, observations: Sequence[Observation]) -> list[Config]:
        """The A/B's entrants, best first (see `entrants`); none once the first has a confirmation round."""
        ranking = self._state(observations).ranking
        return entrants(ranking.ranked(), ranking.contender_margin, observations)

    def to_confirm(self, observations: Sequence[Observation], plan: ABPlan | None = None) -> Config | None:
        """The config whose confirmation round comes next: `plan`'s next entrant (A, B, C, A, B, C, ...),
        or without one a round of each entrant; None when the A/B is done or the first is confirmed."""
        return (plan or ABPlan(tuple(self.ab_entrants(observations)), 1, 0)).next(observations)

    def ranking_margin(self, observations: Sequence[Observation]) -> float:
        """How much faster a dominated config must read to rank above the one it dominates."""
        return self._state(observations).ranking.margin

    def noise_summary(self, observations: Sequence[Observation]) -> str | None:
        """One line when the machine was too noisy to rank configs; None otherwise."""
        return self._state(observations).noise.summary()

    # --- decisions ----------------------------------------------------------------------------
    def _pilot(self) -> Config:
        """The first probe: the space's first strategy (the expected best precision), sized by the memory
        estimator's prediction where it has one (`_predicted_pilot`), else at `_pilot_size`."""
        strategy = self.space.strategies()[0]
        guess = _pilot_size(self.space, self.usable)
        return self.space.config(strategy, _predicted_pilot(self.space, strategy, self.usable, self.prediction, guess)
                                 or guess)

    def _first_of_each_precision(self, state: _State) -> Config | None:
        """Each precision the space holds, probed once early, without checkpointing and at the largest
        batch another precision fits (where the two compare directly): a short budget then still compares
        precisions, and the faster one is explored first. Not before the pilot's strategy (the expected best
        precision) has climbed to its memory edge (`_pilot_climb`): at a small batch every precision reads
        alike on a GPU, and a short budget spends itself on the precision most likely to win."""
        pilot = self.space.strategies()[0]
        probed = {o.config.precision for o in state.observations}
        for strategy in self._order(state):
            if (strategy.precision in probed or strategy.replaced(precision=pilot.precision) != pilot
                    or state.feasible.strategy_unusable(strategy)):
                continue
            candidates = [b for b in state.feasible.open_batches(strategy)
                          if not state.memory.says_too_big(self.space.config(strategy, b))]
            if candidates:  # at the batch the others fit, where the two compare directly
                climb = self._pilot_climb(state, pilot)
                return climb or self.space.config(strategy, _first_batch(state, strategy, candidates))
        return None

    def _pilot_climb(self, state: _State, strategy: Strategy) -> Config | None:
        """The pilot's strategy's next step up (rules 2 and 7) while it fits somewhere and a larger batch
        of it is open; None when it cannot climb (nothing of it fits, nothing above is open: the top of the
        space, the data's ceiling, the memory models) or while a step up is being probed (several runners:
        the others compare the precisions where it fits now)."""
        top = state.feasible.fit_max(strategy)
        # A token function's pilot by samples that fit (its cap's peak) starts the climb too, from below it.
        sized = top is None and any(p <= state.usable for _, p in state.memory.peaks(strategy))
        if top is None and not sized:
            return None  # the pilot did not fit: the precisions are compared at once
        if any(o.status == "running" and self.space.strategy_of(o.config) == strategy and o.config.size > (top or 0)
               for o in state.observations):
            return None
        step = self._next_in_strategy(state, strategy)
        return step if step is not None and step.size > (top or 0) else None

    def _order(self, state: _State) -> list[Strategy]:
        """Each precision without checkpointing, the one measured fastest so far first (the pilot's
        before any is measured), then checkpointing levels (best precision first, fewest blocks first,
        selective before full: it recomputes less), then other accumulations, then shardings."""
        strategies = self.space.strategies()
        first_acc = strategies[0].accumulation_steps

        def best_of_precision(p: str) -> float:
            return max((c.rate for c in state.ranking.ranked() if c.config.precision == p), default=0.0)

        def key(s: Strategy) -> tuple:
            return (
                s.compile,  # compiled strategies once eager ones are known: they start at eager's best
                sum(v != KNOB[n].default for n, v in s.items() if n not in _ORDERED_BY_NAME),  # other knobs: off first
                SHARDINGS.index(s.sharding),
                s.accumulation_steps != first_acc,
                s.checkpoint_segments > 0,
                -best_of_precision(s.precision),  # the precision measured fastest first (each is probed early)
                self.space.values_of("precision").index(s.precision),
                s.checkpoint_segments,
                s.checkpoint_policy != "selective",
            )

        return sorted(strategies, key=key)

    def _next_in_strategy(self, state: _State, strategy: Strategy) -> Config | None:
        """Bracket the largest batch that fits, guided by the memory model; None when resolved. A lever's strategy
        only where memory binds the one without levers, first where it is predicted to fit (rule 12); a size that
        may not fit only as `_probe_now` says."""
        lever = pulls_a_lever(strategy)
        if lever and not state.levers.binds(strategy):
            return None
        candidates = [b for b in state.feasible.open_batches(strategy)
                      if not state.memory.says_too_big(self.space.config(strategy, b))]
        if lever and not state.memory.peaks(strategy):
            candidates = _predicted_to_fit(state, strategy, candidates)
        if not candidates:
            return None
        if _cannot_beat_best(self.space, state, strategy, candidates):
            return None
        step = _step(state, strategy, candidates)
        floor = _climb_floor(state, strategy, candidates)
        if floor is not None and (step is None or step.size < floor):
            return self.space.config(strategy, floor)  # a size the measured peak says certainly fits
        return step if step is not None and _probe_now(state, step) else None

    def _leading_lever(self, state: _State) -> Config | None:
        """Rule 12 on the leader's strategy (the pilot's while nothing fits): where it pulls a lever, its own climb
        before any other strategy's; where memory binds it, a lever at its next size."""
        best = leader(state.ranking.ranked())
        strategy = self.space.strategy_of(best.config) if best is not None else self.space.strategies()[0]
        climb = self._next_in_strategy(state, strategy) if pulls_a_lever(strategy) else None
        return climb or _lever_at_edge(state, strategy)


class _State:
    """One reading of the observations, indexed for the planner's questions: what fits (feasible),
    the memory and throughput models, the noise reading and the ranking (the memory lines and the
    ranking are computed once per reading, however often the planner asks)."""

    def __init__(self, space: SearchSpace, usable: float, observations: Sequence[Observation],
                 check_noise: bool = True, prediction: MemoryPrediction | None = None) -> None:
        self.space = space
        self.usable = usable
        # The configs the space asks for (a token function's pilot came before its knobs; a resumed study's
        # probes of other settings, another global batch or precision, are no answer to this search); a probe
        # the search's budget cut short measured nothing and decides nothing (a resumed search probes it).
        self.observations = [o for o in observations if space.admits(o.config) and not o.cut]
        by_config: dict[Config, list[Observation]] = defaultdict(list)
        for obs in self.observations:
            by_config[obs.config].append(obs)
        # Loader and squares variants are compared with their own kind, not with the batches around them.
        self.noise = NoiseReading(self.observations,
                                  lambda c: (space.strategy_of(c), tuple(c.loader.items()), c.max_squares,
                                             compute_variant(c)))
        # What fits and the memory lines are the space's (a squares variant's peak is not its cap's, nor is a
        # compute variant's an answer for its strategy: an OOM of it rules out none of the plain configs).
        # A token function's pilot by samples ran its cap's worst batch: an answer about memory, never a ranked
        # measurement (the peak of a fit, for the memory line; a cap too big, for what fits).
        self.pilot_caps = _pilot_caps(space, observations)
        self.feasible = Feasibility(space, usable, [o for o in self.observations
                                                    if o.config.max_squares is None and not compute_variant(o.config)]
                                    + [o for o in self.pilot_caps if o.too_big(usable)])
        measured = self.feasible.done + [o for o in self.pilot_caps if o.fits(usable)]
        self.predicted: CalibratedPrediction | None = (
            prediction.calibrate(measured) if prediction is not None else None)
        self.memory = MemoryModels(space, usable, measured, self.predicted)
        self.ranking = Ranking(usable, by_config, self.noise, check_noise)
        self.throughput = ThroughputModels(space, self.ranking)
        self.levers = Levers(space, self.feasible, self.memory, self.throughput)

    @property
    def any_observed(self) -> bool:
        """Anything probed that this space asks for, or a token function's pilot by samples (its cap's memory)."""
        return bool(self.observations or self.pilot_caps)


def _step(state: _State, strategy: Strategy, candidates: list[int]) -> Config | None:
    """The next batch by the prediction (rule 7), or else by the measured memory (rule 2); a token function's
    first cap by the larger of the two, where its pilot by samples measured a cap that fits."""
    if state.predicted is None or not any(state.predicted.peak(state.space.config(strategy, b)) for b in candidates):
        return _measured_step(state, strategy, candidates)
    predicted = _predicted_next(state, strategy, candidates)
    pilot_cap = any(p <= state.usable for _, p in state.memory.peaks(strategy))  # and nothing of its own fits yet
    if state.feasible.fit_max(strategy) is not None or not pilot_cap:
        return predicted
    measured = _measured_step(state, strategy, candidates)
    return measured if predicted is None or (measured is not None and measured.size > predicted.size) else predicted


def _measured_step(state: _State, strategy: Strategy, candidates: list[int]) -> Config | None:
    """The next batch by the measured memory (rule 2): the line, one peak's certain fit, or a bisection."""
    own = state.memory.peaks(strategy)
    if not own:
        return state.space.config(strategy, _first_batch(state, strategy, candidates))
    memory = state.memory.line(strategy)
    if memory is None:
        # One point and nothing to borrow an intercept from: step up, or bisect (geometrically)
        # between the largest fit and the smallest OOM. The point may be a token function's pilot by
        # samples (its cap), which no token probe has measured yet.
        low = (state.feasible.fit_max(strategy) or max((b for b, p in own if p <= state.usable), default=None)
               or state.space.batch_sizes[0])
        high = state.feasible.oom_min(strategy)
        target = (low * high) ** 0.5 if high else low * _PILOT_JUMP
        peak = max((p for b, p in own if b == low), default=None)
        if peak:
            # peak = a + m x batch with a >= 0: up to usable x low / peak fits for sure; a step that far (at least
            # the next batch up) rather than a blind x4 into an OOM, or a bisection toward one (an OOM above)
            above = min((b for b in candidates if b > low), default=target)
            target = min(target, max(state.usable * low / peak, above))
        below = [b for b in candidates if b <= target]
        return state.space.config(strategy, max(below) if below else min(candidates))
    # Extrapolate at most _MAX_LEAP x beyond the largest batch measured: a model fitted on small
    # batches is least sure far away, and an OOM costs more than one more step up.
    measured = max(b for b, _ in own)
    predicted_max = min(memory.solve(state.usable), measured * _MAX_LEAP)
    below = [b for b in candidates if b <= predicted_max]
    if below:
        return state.space.config(strategy, max(below))
    smallest = min(candidates)
    if state.memory.says_too_big(state.space.config(strategy, smallest)):
        return None  # the model, beyond its margin of error, says nothing open fits
    return state.space.config(strategy, smallest)


def _lever_at_edge(state: _State, strategy: Strategy) -> Config | None:
    """Rule 12: where memory binds `strategy`, the lever to probe at its next size (see _lever_rule.py), one that
    could beat the best so far."""
    return state.levers.next_config(strategy, lambda s: not _cannot_beat_best(
        state.space, state, s, state.feasible.open_batches(s) or [state.space.batch_sizes[-1]]))


def _probe_now(state: _State, config: Config) -> bool:
    """Whether a step of a climb is probed now. A size its strategy may not fit (its best guess over the usable
    memory, or the estimator's range across it) waits while a lever is left to probe there (rule 12); then a best
    guess over the usable memory is probed only where it could be _GAMBLE_GAIN faster than the best (rule 7's
    gamble, which `_predicted_next` makes for the estimator's range)."""
    likely = state.memory.likely_too_big(config)
    if not likely and not state.memory.may_not_fit(config):
        return True
    if _lever_at_edge(state, state.space.strategy_of(config)) is not None:
        return False
    ranked = state.ranking.ranked()
    estimate = state.throughput.estimate(state.space.strategy_of(config), config.size)
    return not likely or not ranked or (estimate is not None and estimate >= ranked[0].rate * _GAMBLE_GAIN)


def _predicted_to_fit(state: _State, strategy: Strategy, candidates: list[int]) -> list[int]:
    """A lever's first sizes (rule 12): those predicted to fit at the high end; every one where nothing predicts any."""
    sure = {b: state.memory.fits_for_sure(state.space.config(strategy, b)) for b in candidates}
    return candidates if all(v is None for v in sure.values()) else [b for b, v in sure.items() if v]


def _cannot_beat_best(space: SearchSpace, state: _State, strategy: Strategy, open_batches: list[int]) -> bool:
    """True when even the best open batch of `strategy` is bounded below the best so far."""
    best = leader(state.ranking.ranked())  # loader variants speed up the input, not a strategy
    if best is None:
        return False
    if space.strategy_of(best.config) == strategy and len(state.throughput.points(strategy)) < 3:
        return False  # two noisy points of the leading strategy cannot say its curve has turned
    memory = state.memory.line(strategy)
    reachable = [b for b in open_batches if memory is None or memory(b) <= state.usable]
    largest = max(reachable) if reachable else min(open_batches)
    estimate = state.throughput.estimate(strategy, largest)
    return estimate is not None and estimate * _PRUNE_SLACK < best.rate


def _first_batch(state: _State, strategy: Strategy, candidates: list[int]) -> int:
    """A strategy's first probe is an anchor, not a leap: it measures where OOM is unlikely.

    With checkpointing: just above the largest batch already implied to fit. A new precision:
    the largest batch another precision fits, where the two compare directly.
    """
    if strategy.checkpoint_segments or state.feasible.fit_max(strategy):
        return min(candidates)
    anchor = max((c.config.size for c in state.ranking.ranked()
                  if not c.config.checkpoint_segments and c.config.max_squares is None), default=None)
    below = [b for b in candidates if anchor is not None and b <= anchor]
    return max(below) if below else min(candidates)


def _predicted_next(state: _State, strategy: Strategy, candidates: list[int]) -> Config | None:
    """With predictions: the largest batch predicted to fit at the high end of its range; when
    none is, the smallest still possible, and only if it could beat the best so far."""
    configs = [state.space.config(strategy, b) for b in candidates]
    safe = [c for c in configs if state.predicted.safe(c, state.usable)]
    if safe:
        return max(safe, key=lambda c: c.size)
    gamble = min(configs, key=lambda c: c.size)
    if state.feasible.fit_max(strategy) is None:
        return gamble  # nothing of this family fits yet: the smallest is the one to try
    ranked = state.ranking.ranked()
    estimate = state.throughput.estimate(strategy, gamble.size)
    if ranked and (estimate is None or estimate < ranked[0].rate * _GAMBLE_GAIN):
        return None
    return gamble


def _climb_floor(state: _State, strategy: Strategy, candidates: list[int]) -> int | None:
    """The least step up from the top of a climb (the strategy's largest fit, its peak measured) while its
    throughput still rises: the largest open batch up to twice it that the measured peak says fits for sure
    (peak = a + m x batch with a ≥ 0: up to usable x top / peak(top); nor beyond the strategy's own line).
    Far below the memory edge the climb doubles, whatever the prediction's high end says (a launch-bound
    device: a micro-batch costs about the same whatever its size); near it, it slows by the measured slope.
    None when nothing open is that safe or the throughput has stopped rising."""
    top = state.feasible.fit_max(strategy)
    peak = max((p for b, p in state.memory.peaks(strategy) if b == top), default=None)
    if peak is None or not _rising(state, strategy, top):
        return None
    bound = top * min(2.0, state.usable / peak)
    line = state.memory.line(strategy)
    if line is not None and line.points >= 2:
        bound = min(bound, line.solve(state.usable))
    steps = [b for b in candidates if top < b <= bound
             and not state.memory.says_too_big(state.space.config(strategy, b))]
    return max(steps) if steps else None


def _rising(state: _State, strategy: Strategy, top: int) -> bool:
    """Whether the throughput at `top` is above the next smaller measured batch's (True where either is not
    measured: nothing says it stopped rising)."""
    points = state.throughput.points(strategy)
    at_top = [r for b, r in points if b == top]
    below = [b for b, _ in points if b < top]
    if not at_top or not below:
        return True
    return max(at_top) > max(r for b, r in points if b == max(below))


def _pilot_caps(space: SearchSpace, observations: Sequence[Observation]) -> list[Observation]:
    """A token function's pilot (sized by samples: its knobs were not known) as the token cap it ran: b of
    the data's longest samples (autofit.runtime's `token_sampler`), the same worst batch first as a probe of
    that cap. Its peak is that cap's (it ran or ran out of memory); its rate counts samples, never ranked."""
    if not space.tokens or not space.longest_sample:
        return []
    caps = []
    for o in observations:
        if o.config.max_tokens is None and o.status in ("ok", "oom") and not o.cut:
            cap = o.config.batch_size * space.longest_sample
            config = replace(o.config, batch_size=cap, max_tokens=cap)
            if space.admits(config):
                caps.append(replace(o, config=space.config(space.strategy_of(config), cap), rate=None))
    return caps


def _pilot_size(space: SearchSpace, usable: float) -> int:
    """A memory-scaled guess (_PILOT_BYTES_PER_SAMPLE), at least _PILOT_BATCH; a token space's first cap."""
    sizes = space.batch_sizes
    first = next((b for b in sizes if b >= _PILOT_BATCH), sizes[-1])
    if space.tokens:
        return first
    return max(first, max((b for b in sizes if b <= usable / _PILOT_BYTES_PER_SAMPLE), default=first))


def _predicted_pilot(space: SearchSpace, strategy: Strategy, usable: float, prediction: MemoryPrediction | None,
                     guess: int) -> int | None:
    """The pilot's size from the estimator's prediction, before any probe anchors it (None: it has none). Where
    the device's prior is trusted (`MemoryPrediction.trusted`: a GPU's), the largest micro-batch predicted to fit
    at the high end of its range (the smallest still possible where none is), within what the estimator saw
    the data feed. Elsewhere (a CPU, whose heap no prior bounds before a probe) no larger than the
    memory-scaled `guess` (a CPU probe's time grows with its batch), and smaller only where the guess is
    predicted not to fit even at the low end. A token function's pilot is sized by samples, as before."""
    if prediction is None or space.tokens:
        return None
    calibrated = prediction.calibrate([])
    configs = [space.config(strategy, b) for b in space.batch_sizes]
    configs = [c for c in configs if prediction.covers(c) and calibrated.peak(c) is not None]
    possible = [c for c in configs if not calibrated.too_big(c, usable)]
    if prediction.trusted:
        fits = [c for c in possible if calibrated.safe(c, usable)]
    elif calibrated.too_big(space.config(strategy, guess), usable):
        fits = [c for c in possible if c.size <= guess and prediction.raw_peak(c) <= usable]
    else:
        return None
    if fits:
        return max(c.size for c in fits)
    return possible[0].size if possible else None  # the smallest still possible


def _can_climb(space: SearchSpace, state: _State) -> bool:
    """`Planner.leader_can_climb` on one reading of the observations."""
    top = leader(state.ranking.ranked())
    if top is None:
        return False
    strategy = space.strategy_of(top.config)
    if state.feasible.fit_max(strategy) != top.config.size:
        return False
    above = [space.config(strategy, b) for b in state.feasible.open_batches(strategy) if b > top.config.size]
    return any(not state.memory.says_too_big(c) and not state.memory.likely_too_big(c) for c in above)


def _retry_timed_out(state: _State) -> Config | None:
    """With nothing measured and nothing else to probe, a config that timed out is probed once more
    (the search gives it what the budget left allows): a search never ends with nothing measured
    while its budget lasts. The one that got furthest first: the largest micro-batch."""
    if any(o.status == "ok" for o in state.observations):
        return None
    tries: dict[Config, int] = {}
    for o in state.feasible.done:
        if o.status == "timeout":
            tries[o.config] = tries.get(o.config, 0) + 1
    again = [c for c, n in tries.items() if n < _TIMEOUT_TRIES]
    return max(again, key=lambda c: c.size) if again else None


def _around_the_best(space: SearchSpace, state: _State) -> Config | None:
    """Probe around the best batch, so a throughput peak below the memory limit is not missed:
    half the batch first (while halving keeps improving), then the untried neighbours."""
    top = leader(state.ranking.ranked())  # the loader as the script declares it (rule 8 comes after)
    if top is None:
        return None
    best = top.config
    strategy = space.strategy_of(best)
    sizes = space.batch_sizes
    i = sizes.index(best.size) if best.size in sizes else None
    if i is None:
        return None
    probed_below = [c.config.size for c in state.ranking.ranked()
                    if space.strategy_of(c.config) == strategy and c.config.size < best.size]
    half = max((b for b in sizes if b <= best.size / 2), default=None)
    if half is not None and not any(b >= best.size / 2.5 for b in probed_below):
        config = space.config(strategy, half)
        if not state.feasible.tried(config):
            return config
    for j in (i - 1, i + 1):
        if 0 <= j < len(sizes):
            config = space.config(strategy, sizes[j])
            if (not state.feasible.tried(config) and not state.feasible.implied_too_big(config)
                    and not state.memory.says_too_big(config) and not (j > i and (
                        state.memory.predicted_gamble(config) or state.memory.likely_too_big(config)))):
                return config
    return None
