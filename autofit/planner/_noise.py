"""Is a measurement to be trusted? Interference (another job on the machine, a shared GPU) makes a
probe slow or erratic, and a search that believes it picks the wrong config or prunes the right one.

Pure logic over `Observation`s, used by the planner (so live searches and replays decide alike).
A config's measurement is *suspect* when:

- its steps varied far more than the search's probes usually do (step-time IQR over the median,
  `Observation.spread`, above 3x the typical spread and above 15%): something else ran meanwhile;
- two probes of it disagree beyond the noise seen (more than 3x the typical spread, at least 10%);
- it is far slower (or faster) than both its measured neighbours in size (batch or token cap), same
  strategy: throughput changes smoothly with size, so a dip of 25% below both is a slowdown of the
  machine, not of the config.

Throughput here is each observation's `rate`: samples/s, or real tokens/s by tokens (`Config.ranked_by`).

A suspect config is measured again (a "recheck" probe) before it may win or bound anything: until it
is resolved (two agreeing probes, or three probes: then the fastest steady one counts, since
interference slows probes and never speeds them up) the planner leaves it out of
its ranking and its throughput models. The winner's confirmation (an A/B of the configs within the
noise of it, see `Measurement` and _ab.py) settles it: its figure counts, and may lower the winner below
another entrant (the configs it did not measure compare at its ratio to their short probes: _ranking.py).
A probe slowed evenly looks normal on its own, so before a search ends, the leader of each precision within
reach of the best is probed a second time too: if that reveals a slowdown, the strategies it pruned are open
again. When suspects keep appearing (more than a third of the configs, at least three), the machine is too
noisy to rank configs, and the search says so.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from autofit.config import Config
from autofit.planner._observation import Observation

#: A probe's spread is unusual above this multiple of the typical spread (and above _MIN_SPREAD).
_SPREAD_FACTOR = 3.0
_MIN_SPREAD = 0.15
#: Two probes of one config disagree beyond this multiple of the typical spread (and _MIN_REPEAT).
_REPEAT_FACTOR = 3.0
_MIN_REPEAT = 0.10
#: A config slower (or faster) than both neighbours by this fraction is out of line.
_NEIGHBOUR_GAP = 0.25
#: The typical spread is never taken below this (a quiet machine still jitters).
_SPREAD_FLOOR = 0.02
#: A precision's leader within this factor of the best is confirmed by a second probe (interference
#: was seen to slow probes up to 4x).
_LEADER_REACH = 4.0
#: Probes of one config beyond which its median is trusted whatever the disagreement.
_RESOLVING_PROBES = 3
#: A/B rounds of one config beyond which their median is its figure however they spread (they alternated with
#: the other entrants'); fewer that disagree beyond the noise decide nothing (`NoiseReading.undecided`).
SETTLING_ROUNDS = 3


@dataclass(frozen=True)
class Suspicion:
    config: Config
    reason: str


@dataclass(frozen=True)
class Measurement:
    """The probes a config's figures come from, and the rule that chose them: "confirmation" (the median
    of its confirmation rounds, the A/B's (see _ab.py), steady or not: rounds longer than a probe measure
    what training will see, alternating with the other entrants so that the machine's drift falls on all
    of them, and a slowdown that sets in after the short probes' steps shows as steps that vary; so it
    may lower the short probes' figure), "fastest" (steady probes that disagree beyond the noise seen: the fastest
    alone, since interference slows a probe and never speeds it up) or "median" (the rest).
    Every rate of the best-config file is taken from these probes."""

    probes: tuple[Observation, ...]
    rule: str
    erratic: bool = False
    """Its steps varied far beyond the search's usual (interference, or a slowdown in a long run)."""
    undecided: str | None = None
    """Why its A/B rounds are not its figure yet (None: they are, or it has none): fewer than SETTLING_ROUNDS
    that disagree beyond the noise, with each other or, a lone round, with its short probes. Its figure is
    then its short probes' (`probes`), and the A/B needs another round (`_ab.entrants`)."""

    @classmethod
    def of(cls, probes: Sequence[Observation]) -> Measurement:
        """All of `probes`' confirmation runs when they have any, else all of them."""
        counted = confirmed_first(probes)
        return cls(tuple(counted), "confirmation" if counted[0].phase == "confirm" else "median")

    @property
    def rate(self) -> float:
        """The median rate of its probes (`Observation.rate`)."""
        return statistics.median(o.rate for o in self.probes)


def confirmed_first(obs: Sequence[Observation]) -> list[Observation]:
    """A config's confirmation runs when it has any, else all its probes."""
    return [o for o in obs if o.phase == "confirm"] or list(obs)


class NoiseReading:
    """What the probes so far say about the machine's noise, and which configs to measure again."""

    def __init__(self, observations: Sequence[Observation], strategy_of) -> None:
        self._strategy_of = strategy_of
        self.ok: dict[Config, list[Observation]] = defaultdict(list)
        for o in observations:
            if o.status == "ok" and o.rate:
                self.ok[o.config].append(o)
        spreads = [o.spread for obs in self.ok.values() for o in obs if o.spread is not None]
        self.typical_spread = max(_SPREAD_FLOOR, statistics.median(spreads)) if spreads else _SPREAD_FLOOR
        self._spread_limit = max(_MIN_SPREAD, _SPREAD_FACTOR * self.typical_spread)
        self.repeat_limit = max(_MIN_REPEAT, _REPEAT_FACTOR * self.typical_spread)
        """Two probes of one config may differ this much (a fraction of the faster) and still agree."""
        self.measured_noise = self._measured_noise()
        """How much two measurements of one config differ here, measured: the median gap between the short
        probes of the configs probed more than once, and at least half the typical step spread (a probe's rate
        is the mean of a few steps: two that agree by luck must not make a noisy machine look quiet). What a
        lead must exceed to be one (dominance, the A/B's entrants), with no floor of its own: a quiet
        device's 1% is 1%."""
        self._suspicions = self._find()

    def _measured_noise(self) -> float:
        gaps = []
        for obs in self.ok.values():
            rates = [o.rate for o in obs if o.phase != "confirm"]
            if len(rates) >= 2:
                gaps.append((max(rates) - min(rates)) / max(rates))
        return max(statistics.median(gaps) if gaps else 0.0, self.typical_spread / 2)

    # --- the rules ------------------------------------------------------------------------------
    def rate(self, config: Config) -> float:
        """What `config`'s probes say its rate is (see `measurement`)."""
        return self.measurement(config).rate

    def measurement(self, config: Config) -> Measurement:
        """The probes `config`'s figures come from: its confirmation runs when it has one, else its
        steady probes (erratic ones only when it has no steady one); the fastest alone when they
        disagree beyond the noise seen, else their median."""
        return self._measure(self.ok[config])

    def _measure(self, obs: list[Observation]) -> Measurement:
        measured = Measurement.of(obs)
        undecided = self.undecided(obs) if measured.rule == "confirmation" else None
        if undecided is not None:  # rounds that decide nothing: the short probes' figure, and why
            return replace(self._measure([o for o in obs if o.phase != "confirm"]), undecided=undecided)
        if measured.rule == "median":
            measured = Measurement.of([o for o in obs if not self._erratic(o)] or obs)
        measured = replace(measured, erratic=any(self._erratic(o) for o in measured.probes))
        if measured.rule == "median" and len(measured.probes) >= 2 and self._disagree(measured.probes):
            fastest = max(measured.probes, key=lambda o: o.rate)
            return replace(measured, probes=(fastest,), rule="fastest")
        return measured  # an A/B's rounds count at their median, however they spread: they alternated

    def undecided(self, obs: Sequence[Observation]) -> str | None:
        """Why a config's A/B rounds (of `obs`, its probes that ran) decide nothing yet, None when they do: fewer
        than SETTLING_ROUNDS rounds that disagree beyond the noise, two of them with each other (by more than
        `repeat_limit`), a lone one with its short probes (by that twice over, as ratios: a round runs longer
        than a probe and reads lower by design, `Ranking.scale`, so the two differ in length as well as in
        time; at the 10% floor a lone round 19% below its probes still decides). One
        short round on a busy machine read 11.2k samples/s where its probe had read 359k, and named the other
        entrant the winner on one round each: a round that far off may be the machine's (interference) or the
        config's (it slows in long runs), and another round tells which. Once two rounds agree, or
        SETTLING_ROUNDS ran, their median is the figure."""
        rounds = [o.rate for o in obs if o.phase == "confirm"]
        short = [o for o in obs if o.phase != "confirm"]
        if not rounds or len(rounds) >= SETTLING_ROUNDS or (len(rounds) == 1 and not short):
            return None
        unit = obs[0].config.ranked_by.unit
        if len(rounds) == 1:
            probes, limit = self._measure(short).rate, 1 - (1 - self.repeat_limit) ** 2
            if abs(rounds[0] - probes) / max(rounds[0], probes) <= limit:
                return None
            return (f"its A/B round read {rounds[0]:,.1f} {unit} against {probes:,.1f} on its probes, beyond the "
                    f"noise ({limit:.0%})")
        if (max(rounds) - min(rounds)) / max(rounds) <= self.repeat_limit:
            return None
        return (f"its A/B rounds read {', '.join(f'{r:,.1f}' for r in rounds)} {unit}, apart beyond the noise "
                f"({self.repeat_limit:.0%})")

    def _erratic(self, o: Observation) -> bool:
        return o.spread is not None and o.spread > self._spread_limit

    def _find(self) -> dict[Config, Suspicion]:
        found: dict[Config, Suspicion] = {}
        repeat_limit, spread_limit = self.repeat_limit, self._spread_limit
        for config, obs in self.ok.items():
            if len(obs) >= _RESOLVING_PROBES or any(o.phase == "confirm" for o in obs):
                continue  # settled: by enough probes, or by a long run (see `measurement`)
            rates = [o.rate for o in obs]
            if len(obs) == 2:
                gap = abs(rates[0] - rates[1]) / max(rates)
                if gap > repeat_limit:
                    found[config] = Suspicion(config, f"two probes disagree ({rates[0]:,.1f} vs {rates[1]:,.1f} "
                                                      f"{config.ranked_by.unit}, {gap:.0%} apart)")
                continue  # two agreeing probes: resolved
            spread = obs[0].spread
            if spread is not None and spread > spread_limit:
                found[config] = Suspicion(config, f"its steps varied {spread:.0%} (IQR of the median step), "
                                                  f"{spread / self.typical_spread:.1f}x the search's usual")
                continue
            gap = self._neighbour_gap(config)
            if gap is not None:
                found[config] = Suspicion(config, gap)
        return found

    def unconfirmed_leaders(self, among: Callable[[Config], bool] = lambda c: True) -> list[Config]:
        """Leaders of their precision measured once, fastest first, that a search must probe again
        before it ends. A probe slowed evenly shows nothing unusual on its own, and the leader of
        each precision decided what wins and which strategies were pruned: a leader within reach of
        the best (what interference could hide, up to _LEADER_REACH x) needs a second probe. `among`: the
        configs that may lead (those that fit)."""
        leaders = self._leaders(among)
        top = max((self.rate(c) for c in leaders), default=0.0)
        out = [c for c in leaders if len(self.ok[c]) == 1 and c not in self._suspicions
               and self.rate(c) * _LEADER_REACH >= top]
        return sorted(out, key=self.rate, reverse=True)

    def _leaders(self, among: Callable[[Config], bool]) -> list[Config]:
        """The fastest config of each precision among those `among` takes (single probes count at face value)."""
        best: dict[str, Config] = {}
        for config in filter(among, self.ok):
            current = best.get(config.precision)
            if current is None or self.rate(config) > self.rate(current):
                best[config.precision] = config
        return list(best.values())

    def short_rate(self, config: Config) -> float:
        """What `config`'s short probes say (a long run's figure compares with no short one)."""
        return self._measure([o for o in self.ok[config] if o.phase != "confirm"] or self.ok[config]).rate

    def _neighbour_gap(self, config: Config) -> str | None:
        strategy = self._strategy_of(config)
        same = sorted((c for c in self.ok if self._strategy_of(c) == strategy), key=lambda c: c.size)
        i = same.index(config)
        if i == 0:
            return None
        rate, short, unit = self.rate(config), self.short_rate, config.ranked_by.unit
        if i == len(same) - 1:  # the largest size so far: throughput rarely falls steeply with size
            low = same[i - 1]
            if rate < short(low) * (1 - _NEIGHBOUR_GAP):
                return f"{rate:,.1f} {unit} is far slower than the smaller {low.size_label()} ({short(low):,.1f})"
            return None
        low, high = same[i - 1], same[i + 1]
        around = (short(low), short(high))
        if rate < min(around) * (1 - _NEIGHBOUR_GAP):
            word = "slower"
        elif rate > max(around) * (1 + _NEIGHBOUR_GAP):
            word = "faster"
        else:
            return None
        return (f"{rate:,.1f} {unit} is far {word} than its neighbours {low.size_label()} "
                f"({around[0]:,.1f}) and {high.size_label()} ({around[1]:,.1f})")

    # --- answers ------------------------------------------------------------------------------
    def unresolved(self) -> dict[Config, Suspicion]:
        """Configs whose measurement cannot be trusted yet."""
        return dict(self._suspicions)

    def is_unresolved(self, config: Config) -> bool:
        return config in self._suspicions

    def too_noisy(self) -> bool:
        """Suspects in more than a third of the measured configs (at least three of them): the
        machine's noise is larger than the differences the search must rank."""
        suspects = len(self._doubtful())
        return suspects >= 3 and suspects > len(self.ok) / 3

    def _doubtful(self) -> set[Config]:
        """Unresolved suspects, and configs whose probes disagreed even if a third one settled them."""
        return set(self._suspicions) | {c for c, obs in self.ok.items()
                                        if len(counted := confirmed_first(obs)) >= 2 and self._disagree(counted)}

    def _disagree(self, obs: Sequence[Observation]) -> bool:
        rates = [o.rate for o in obs]
        return (max(rates) - min(rates)) / max(rates) > self.repeat_limit

    def summary(self) -> str | None:
        """One line for the end of a search, or None on a machine quiet enough to rank configs."""
        if not self.too_noisy():
            return None
        return (f"this machine was too noisy to rank configs reliably: {len(self._doubtful())} "
                f"of {len(self.ok)} measured configs were slowed or disagreed with their repeats or neighbours "
                f"beyond the usual {self.typical_spread:.0%} step spread (another job on the CPU or GPU?); "
                f"the winner may be off by that much: search again on a quiet machine")
