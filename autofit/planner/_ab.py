"""The confirmation as an A/B: the configs within the noise of the leader measured against each other,
alternating (A, B, C, A, B, C, ...), over windows longer than a probe, before a winner is named.

Why: on a noisy machine one short probe each ranks configs by luck (a slowdown that lasts a few seconds
lands on one config and spares the next), and the search drifts toward configs an expert would never
pick. Rounds that alternate share whatever drift the machine has between the entrants, and the median of
each entrant's rounds is its figure (`Measurement`: a config's confirmation rounds count before its short
probes), so the ranking the winner comes from is the A/B's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autofit.config import Config
from autofit.planner._observation import Observation
from autofit.planner._ranking import Candidate, dominates

#: The A/B's entrants: the leader and the next within the noise of it, this many at most. Each entrant's
#: rounds add up to a whole confirmation run, so a third entrant made every search's decision 50% longer
#: (the heavy test tiers went from 47 to 57 minutes) for a config that ranked third on its short probes.
AB_ENTRANTS = 2
#: Rounds each entrant runs in a full A/B (fewer when the budget left cannot hold them).
AB_ROUNDS = 3
#: Close contenders measured again before the A/B: the first this many within the noise of the best.
CONTENDERS = 3


def within_noise(ranked: Sequence[Candidate], margin: float) -> list[Candidate]:
    """The ranking's first and the configs no slower than it by more than `margin` (the noise the search
    has seen), best first: the ones a single probe cannot tell apart from the first. A config the first
    dominates is among them when it read faster: the A/B's rounds, not the rule, say whether it is."""
    if not ranked:
        return []
    floor = ranked[0].standing * (1 - margin)
    return [c for i, c in enumerate(ranked)
            if i == 0 or (c.standing >= floor and not any(dominates(a.config, c.config) and c.standing <= a.standing
                                                          for a in ranked[:i]))]


def contenders(close: Sequence[Candidate], remeasured: set[Config]) -> list[Config]:
    """Of the configs within the noise of the first (`within_noise`), the first CONTENDERS measured once
    and not remeasured yet; none when the first has no company (its confirmation measures it)."""
    if len(close) < 2:
        return []
    return [c.config for c in close[:CONTENDERS] if c.probes <= 1 and c.config not in remeasured]


def entrants(ranked: Sequence[Candidate], margin: float, observations: Sequence[Observation]) -> list[Config]:
    """The A/B's entrants: the ranking's first and the next within the noise of it (`within_noise`),
    AB_ENTRANTS at most, best first. Once the first has a confirmation round, the search has its winner
    unless a config no A/B measured reads faster on its short probes than the first on its rounds by more
    than `margin`: its figure ranks at the A/Bs' scale (`Candidate.standing`), which assumes the first's
    rounds fell as every config's would, so it is measured as long in turn, alone (a config that slows
    only in long runs is caught so: a first measured again in short rounds beside it would hide it); none
    when there is none. A round the budget cut short measured nothing (`Observation.cut`): a resumed
    search runs it. A first whose rounds decide nothing yet (`Measurement.undecided`: they disagree beyond the
    noise) runs its A/B again, with whatever is within the noise of it now: one disagreeing round never
    names the winner."""
    if not ranked:
        return []
    first = ranked[0]
    confirmed = any(o.phase == "confirm" and not o.cut and o.config == first.config for o in observations)
    if not confirmed or (first.measurement is not None and first.measurement.undecided):
        return [c.config for c in within_noise(ranked, margin)[:AB_ENTRANTS]]
    challenger = next((c for c in ranked[1:] if c.measurement.rule != "confirmation"
                       and c.rate > first.rate * (1 + margin)), None)
    return [challenger.config] if challenger is not None else []


@dataclass(frozen=True)
class ABPlan:
    """One A/B: its entrants, the rounds each runs and the measured steps of each round (its window),
    counting only the rounds after trial `since` (an entrant of an earlier A/B starts again at 0)."""

    entrants: tuple[Config, ...]
    rounds: int
    steps: int
    since: int = -1

    def next(self, observations: Sequence[Observation]) -> Config | None:
        """The entrant whose round comes next: the one with the fewest rounds so far, the first of them on
        ties (so A, B, C, A, B, C, ...); an entrant whose round failed runs no more. A round the budget cut
        short counts for nothing: it measured nothing, and failed nothing. None: done."""
        counts = dict.fromkeys(self.entrants, 0)
        out: set[Config] = set()
        for o in observations:
            if o.phase == "confirm" and not o.cut and o.config in counts and (o.trial is None or o.trial > self.since):
                counts[o.config] += 1
                if o.status not in ("ok", "running"):
                    out.add(o.config)
        pending = [c for c in self.entrants if c not in out and counts[c] < self.rounds]
        return min(pending, key=counts.__getitem__) if pending else None  # min keeps the first of equals

    def done(self, observations: Sequence[Observation]) -> bool:
        return self.next(observations) is None
