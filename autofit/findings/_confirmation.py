"""The confirmation as the best-config file and the why-line say it: what the A/B measured (each entrant's
rounds, their median and spread), whether it changed the winner, and why a winner is unconfirmed."""

from __future__ import annotations

import statistics
from collections import defaultdict

from autofit.config import Config
from autofit.export import ABEntrant, ABRecord
from autofit.planner import Candidate, Planner

#: Why a winner is unconfirmed when the search ended without measuring it in an A/B.
UNCONFIRMED_BUDGET = ("the budget left no room for the A/B that confirms a winner: its figure is a short "
                      "probe's (give the search a longer --budget)")


def ab_record(ranked: list[Candidate], done, planner: Planner) -> ABRecord | None:
    """The A/B (the confirmation) as the file keeps it: each entrant's config label, its rounds' rates (at
    `Config.ranked_by`) in the order they ran, their median and spread ((max - min) / median), best first; the
    A/B's spread (the widest of its entrants'); the config that led before it. None when no round ran."""
    rounds: dict[Config, list[float]] = defaultdict(list)
    for o in sorted(done, key=lambda o: o.trial if o.trial is not None else -1):
        if o.phase == "confirm" and o.status == "ok" and o.rate:
            rounds[o.config].append(o.rate)
    if not rounds:
        return None
    feasible = [c.config for c in ranked if c.config in rounds]
    order = feasible + [c for c in rounds if c not in feasible]
    entrants = tuple(ABEntrant(label=c.label(), rounds=tuple(rounds[c]), median=statistics.median(rounds[c]),
                               spread=_spread(rounds[c])) for c in order)
    led = led_before(done, planner)
    return ABRecord(entrants=entrants, spread=max(e.spread for e in entrants),
                    led_before=led.label() if led is not None else None)


def _spread(rates: list[float]) -> float:
    return (max(rates) - min(rates)) / statistics.median(rates)


def led_before(done, planner: Planner) -> Config | None:
    """The config that ranked first on the short probes, before any confirmation round."""
    return planner.best([o for o in done if o.phase != "confirm"])


def ab_words(ranked: list[Candidate], done, planner: Planner) -> str | None:
    """The why-line's words when the A/B changed the winner: the config that led on its short probes, and
    how it ran against the winner in the A/B."""
    best = ranked[0]
    led = led_before(done, planner)
    if led is None or led == best.config or best.measurement is None or best.measurement.rule != "confirmation":
        return None
    short = next((c.rate for c in planner.ranked([o for o in done if o.phase != "confirm"])
                  if c.config == led), None)
    in_ab = next((c for c in ranked if c.config == led and c.measurement.rule == "confirmation"), None)
    against = (f"ran {in_ab.rate / best.rate:.2f}x of it in the A/B" if in_ab is not None
               else "was not measured in the A/B")
    return (f"the A/B changed the winner: {led.label()} led on its short probes"
            + (f" ({short:,.1f} {led.ranked_by.unit})" if short else "") + f" but {against}")


def undecided_reason(undecided: str) -> str:
    """Why a winner whose A/B rounds decide nothing (`Measurement.undecided`: they disagree beyond the noise) is
    unconfirmed: no round named it, and no other round could be run."""
    return (f"its A/B was undecided ({undecided}) and the search ended before another round: its figure is its "
            f"short probes' (a longer --budget, on a quieter machine, decides it)")


def unconfirmed_reason(confirmed: bool, done, partial: bool, undecided: str | None = None) -> str | None:
    """Why the winner was not measured in an A/B; None when it was. A round the budget cut short measured
    nothing (`Observation.cut`): an A/B of cut rounds alone is no A/B, and the budget is the reason. Rounds
    that disagree beyond the noise (`undecided`: why) confirm nothing either."""
    if confirmed:
        return None
    if undecided:
        return undecided_reason(undecided)
    if partial:
        return "the search ended (interrupted, or unfinished) before the A/B that confirms a winner"
    if any(o.phase == "confirm" and not o.cut for o in done):
        return ("the A/B measured its entrants below this config's short probes, and the search ended "
                "before it could be measured in turn: its figure is a short probe's")
    return UNCONFIRMED_BUDGET
