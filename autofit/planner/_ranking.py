"""How probed configs rank: the median throughput of each (`Observation.rate`: samples/s, or real tokens/s
by tokens; its confirmation run's once it has one; when rechecking noise, the rate the noise reading
trusts: `NoiseReading.measurement`), feasible ones only.

Configs compare like with like (`Candidate.standing`): an A/B's rounds run longer than a short probe and
read lower (4.5% lower on one machine, for every entrant alike), so a config measured in short probes alone
ranks at its short figure times the ratio the A/Bs measured between their entrants' rounds and the same
entrants' short probes (`Ranking.scale`), not at its short figure against the entrants' A/B figures. The A/B
still orders its entrants (their rounds against each other), and a short figure never outranks a long one
for being short. A lone config measured longer (no A/B) sets the ratio alone: it corrects its own figure,
and the others compare at its ratio (one faster beyond the noise is measured in turn: `_ab.entrants`).

Two rules an expert applies come on top of the figures:

- **dominance**: a config that adds recompute (checkpointing, or a heavier policy) or accumulation
  where a config without it fits, every other knob the same (precision, sharding, compile, activation
  offload, memory format, loader: `SAME_WORK`, from the knobs' declarations) at the same global batch,
  does the same work and more: it ranks below the config it dominates unless it is faster by more
  than the noise the search has seen (`margin`);
- **ties as an expert settles them**: among configs within `TIE_TOLERANCE` of the best, one that did
  not need allocator retries, then less recompute (none, selective, full), then fewer accumulation
  steps (a larger micro-batch), then the lower peak.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from autofit.config import KNOB, KNOBS, Config
from autofit.planner._noise import Measurement, NoiseReading
from autofit.planner._observation import Observation
from autofit.planner._recompute import ORDERED_BY_RULES, checkpoint_policy, recomputes_no_more

#: Configs within this fraction of the best throughput are ties, won by the lower peak.
TIE_TOLERANCE = 0.02
MAX_CONTENDER_MARGIN = 0.25
"""A contender (measured again, an A/B entrant) is never further behind the first than this: where steps
last milliseconds the timer's noise makes their spread large (0.3-0.6 on a 2-rank CPU search) while
probes' medians agree within a few percent, and a config a quarter slower on its probes is slower. A
dominated config still needs the whole margin to rank above the config it dominates."""
#: The knobs two configs must share for one to do the other's work and more (`dominates`): every knob but the
#: size a search climbs (compared as the global batch) and those whose order the recompute rules know
#: (checkpointing, accumulation). Derived from the declarations, so a knob added to Config is compared
#: until a rule says how it orders work.
SAME_WORK: tuple[str, ...] = tuple(k.name for k in KNOBS if k.order != "size" and k.name not in ORDERED_BY_RULES)


@dataclass(frozen=True)
class Candidate:
    """A feasible config with its measured throughput (see `measurement`) and peak."""

    config: Config
    rate: float
    """Its measured throughput in `config.ranked_by` (samples/s, or real tokens/s by tokens)."""
    peak_bytes: int | None
    probes: int
    tight: bool = False  # some probe of it needed allocator retries: it only just fits
    measurement: Measurement | None = None
    """The probes its throughput (and every rate of the best-config file) comes from."""
    scale: float = 1.0
    """What puts `rate` beside the A/Bs' figures: 1 when an A/B measured it (or none ran), else the A/Bs'
    ratio of long rounds to short probes (`Ranking.scale`)."""

    @property
    def standing(self) -> float:
        """The figure it ranks by: its rate at the A/Bs' scale (like with like; `rate` stays the measured
        figure every report and file gives)."""
        return self.rate * self.scale


class Ranking:
    """The measured configs and the feasible ones best first, computed once per reading."""

    def __init__(self, usable: float, by_config: Mapping[Config, Sequence[Observation]], noise: NoiseReading,
                 check_noise: bool) -> None:
        self.usable = usable
        self.by_config = by_config
        self.noise = noise
        self.check_noise = check_noise
        self._measured: list[Candidate] | None = None
        self._ranked: list[Candidate] | None = None

    def measured(self) -> list[Candidate]:
        """Every config that ran its steps (inside the headroom or not), with its measured throughput.

        Suspect measurements (see _noise.py) are left out until a recheck resolves them, so they
        neither win nor bound other strategies; unless no trusted config fits (a search whose rechecks
        ran out on a noisy machine still exports the fastest config that fits, not "nothing fits")."""
        if self._measured is not None:
            return self._measured
        trusted = [c for c in self.by_config if not (self.check_noise and self.noise.is_unresolved(c))]
        if not any(self.fits(c) for c in trusted):
            trusted = list(self.by_config)
        out = []
        for config in trusted:
            obs = self.by_config[config]
            ok = [o for o in obs if o.status == "ok" and o.rate]
            if ok:
                # the peak: the highest any of its probes reached (a run must fit all of them)
                peaks = [o.peak_bytes for o in ok if o.peak_bytes is not None]
                measurement = self.noise.measurement(config) if self.check_noise else Measurement.of(ok)
                out.append(Candidate(config, measurement.rate, max(peaks) if peaks else None, len(ok),
                                     any(o.tight for o in ok), measurement))
        scale = self.scale(out)
        self._measured = [c if c.measurement.rule == "confirmation" else replace(c, scale=scale) for c in out]
        return self._measured

    def scale(self, measured: Sequence[Candidate]) -> float:
        """The A/Bs' ratio of long rounds to short probes: the median, over the configs with A/B rounds, of
        their rounds' figure over their own short probes' (both as `measurement` takes them); 1 before any
        A/B. A short figure times it compares with an A/B's figure (see the module's docstring)."""
        ratios = [c.rate / short for c in measured
                  if c.measurement.rule == "confirmation" and (short := self._short_rate(c.config))]
        return statistics.median(ratios) if ratios else 1.0

    def _short_rate(self, config: Config) -> float | None:
        """What `config`'s short probes say (all but its A/B rounds); None without any."""
        short = [o for o in self.by_config[config] if o.status == "ok" and o.rate and o.phase != "confirm"]
        if not short:
            return None
        return self.noise.short_rate(config) if self.check_noise else Measurement.of(short).rate

    def fits(self, config: Config) -> bool:
        """It ran its steps, and no probe of it crossed the headroom or failed."""
        obs = self.by_config[config]
        return any(o.status == "ok" and o.rate for o in obs) and not any(o.too_big(self.usable) or o.failed
                                                                        for o in obs)

    def ranked(self) -> list[Candidate]:
        """Feasible configs, best first: throughput like with like (`Candidate.standing`), with near-ties
        broken toward configs that did not need allocator retries, then toward lower peak."""
        if self._ranked is None:
            feasible = [c for c in self.measured() if self.fits(c.config)]
            feasible.sort(key=lambda c: -c.standing)
            if feasible:
                top = feasible[0].standing
                ties = [c for c in feasible if c.standing >= top * (1 - TIE_TOLERANCE)]
                rest = [c for c in feasible if c not in ties]
                ties.sort(key=lambda c: (c.tight, _expert_order(c.config), c.peak_bytes or 0, -c.standing))
                feasible = _dominated_last(ties + rest, self.margin)
            self._ranked = feasible
        return self._ranked

    @property
    def margin(self) -> float:
        """How much faster a dominated config must measure to rank above the config it dominates: the noise
        measured between two probes of one config (`NoiseReading.measured_noise`), the tie tolerance at least.
        No floor beyond it: a 10% floor once made the largest micro-batch win unless a smaller one was 10%
        faster, even on a quiet device."""
        return max(TIE_TOLERANCE, self.noise.measured_noise)

    @property
    def contender_margin(self) -> float:
        """How far behind the first a config may read and still be measured against it (see `margin`)."""
        return min(MAX_CONTENDER_MARGIN, self.margin)

    def dominated_by(self, config: Config) -> Candidate | None:
        """The feasible config `config` adds work to, if one was measured (see `dominates`)."""
        return next((c for c in self.ranked() if dominates(c.config, config)), None)


def dominates(plain: Config, heavier: Config) -> bool:
    """Whether `heavier` does `plain`'s work and more: the same global batch and every knob of `SAME_WORK`
    the same (as it acts: `Knob.acting`), no less recompute and no fewer accumulation steps, and more of one
    of them."""
    if plain == heavier or plain.global_batch != heavier.global_batch:
        return False
    if any(KNOB[name].acting(plain) != KNOB[name].acting(heavier) for name in SAME_WORK):
        return False
    if not recomputes_no_more(plain, heavier) or plain.accumulation_steps > heavier.accumulation_steps:
        return False
    return plain.accumulation_steps < heavier.accumulation_steps or not recomputes_no_more(heavier, plain)


def _expert_order(config: Config) -> tuple:
    """Less recompute first (none, then selective, then full; fewer blocks first), then fewer
    accumulation steps: what an engineer picks among configs that run equally fast."""
    policy = checkpoint_policy(config) if config.checkpoint_segments else "none"
    return (("none", "selective", "full").index(policy), config.checkpoint_segments, config.accumulation_steps)


def _dominated_last(ranked: list[Candidate], margin: float) -> list[Candidate]:
    """`ranked` with each config moved just below any config it dominates that it does not beat by
    more than `margin` (stable otherwise). A config that only just fits (allocator retries) dominates
    nothing: at the memory edge its next run may not fit, or run slower for the retries."""
    out = list(ranked)
    moved = True
    while moved:
        moved = False
        for i, candidate in enumerate(out):
            below = [j for j, other in enumerate(out) if j > i and not other.tight
                     and dominates(other.config, candidate.config)
                     and candidate.standing <= other.standing * (1 + margin)]
            if below:
                out.insert(below[-1], out.pop(i))  # just below the last config it yields to
                moved = True
                break
    return out
