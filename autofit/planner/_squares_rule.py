"""The squares cap's turn (rule 9 of the planner): per-length token caps for a function that batches by
tokens, probed where they can pay.

The climb sets one token cap T by its worst batch: the data's longest samples (length L) at the cap. Under
T no batch holds more than T x L padded squares (samples x longest², what an attention that is not fused
holds per head and layer), and a batch of shorter samples holds fewer squares than the worst: the memory
it leaves is what a larger token cap could use there. So the leader is probed with larger token caps
under a squares cap of T x L (`Config.max_squares`): the long batches stay as they were, the short ones
hold more tokens (a cap per length, as 2-D buckets are; NeMo's OOMptimizer searches one batch size per
length bucket by probing each). A batch's memory is about a + b x tokens + c x squares, so at a fixed
squares cap it is a line in the token cap, fitted through the leader's peak and each variant's; the
climb follows it as rule 2 does a strategy's batch, and stops at the first variant that does not fit,
or is no faster.

It pays only where the quadratic term holds a large share of the worst batch's memory (an attention that
is not fused, long samples) and a larger batch is faster: where a larger token cap of the leader's own
strategy fit and ran no faster, the steps are saturated already and no variant is probed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from autofit.config import Config
from autofit.planner._models import fit_line
from autofit.planner._observation import Observation
from autofit.planner._ranking import Candidate
from autofit.planner._search_space import SearchSpace

#: A variant must be this much faster than the best so far for the climb to go on.
_SQUARES_GAIN = 1.03
#: The largest token cap a variant may have, as a multiple of the leader's.
_MAX_FACTOR = 8
#: At most this many times the largest token cap measured, in one step (as rule 2's leap).
_MAX_LEAP = 4


def squares_cap(config: Config, longest: int) -> int:
    """The most padded squares a batch under `config`'s token cap can hold: T x L (n samples of length l
    hold n x l² <= T x l, at most T x L)."""
    return config.max_tokens * longest


def variant(config: Config, max_tokens: int, max_squares: int) -> Config:
    """`config` at a larger token cap under a squares cap (no cap on its samples, as the space's configs)."""
    return replace(config, max_tokens=max_tokens, batch_size=max_tokens, max_squares=max_squares)


def base_of_variant(config: Config, longest: int) -> Config | None:
    """The leader a squares variant was derived from (None for a config without a squares cap)."""
    if config.max_squares is None or config.max_squares % longest:
        return None
    tokens = config.max_squares // longest
    return replace(config, max_tokens=tokens, batch_size=tokens, max_squares=None)


def next_squares_config(space: SearchSpace, base: Candidate | None, ranked: Sequence[Candidate],
                        observations: Sequence[Observation], usable: float) -> Config | None:
    """The next squares variant of `base` (the leader with the loader as declared) to probe, or None when
    none is worth it (or one is running: the next step depends on what it measures)."""
    longest = space.longest_sample
    if not space.tokens or not longest or base is None or base.config.max_tokens is None:
        return None
    leader = base.config
    if _saturated(space, leader, observations, usable):
        return None
    mine = [o for o in observations if base_of_variant(o.config, longest) == leader]
    if any(o.status == "running" for o in mine):
        return None
    cap = squares_cap(leader, longest)
    rungs = [s for s in space.batch_sizes if leader.max_tokens < s <= leader.max_tokens * _MAX_FACTOR]
    rates = {c.config: c.rate for c in ranked}
    best_rate, points, last = base.rate, [(leader.max_tokens, base.peak_bytes)], leader.max_tokens
    for o in sorted(mine, key=lambda o: o.config.max_tokens):
        rate = rates.get(o.config)
        if not o.fits(usable) or rate is None or rate < best_rate * _SQUARES_GAIN:
            return None  # out of memory, failed, or no faster: the climb ends here
        best_rate, last = rate, o.config.max_tokens
        points.append((o.config.max_tokens, o.peak_bytes))
    above = [s for s in rungs if s > last]
    if not above:
        return None
    line = fit_line([(x, float(y)) for x, y in points if y is not None])
    if line is None or line.slope <= 0:
        return variant(leader, above[0], cap)  # one point: the next rung up
    reach = min(line.solve(usable), last * _MAX_LEAP)
    within = [s for s in above if s <= reach]
    return variant(leader, max(within), cap) if within else None


def _saturated(space: SearchSpace, leader: Config, observations: Sequence[Observation], usable: float) -> bool:
    """A larger token cap of the leader's own strategy fit (and ranked below it): larger batches run no
    faster, and a variant's are larger only where the samples are short."""
    strategy = space.strategy_of(leader)
    return any(o.config.max_squares is None and not o.config.loader and space.strategy_of(o.config) == strategy
               and o.config.size > leader.size and o.fits(usable) for o in observations)


def squares_reason(ranked: Sequence[Candidate], longest: int | None) -> str | None:
    """Why the winner holds a squares cap: 'a squares cap at max_tokens=4096's longest batch lets the
    short batches hold 8192 tokens: 1.4x'. None when it holds none."""
    if not ranked or not longest or ranked[0].config.max_squares is None:
        return None
    winner = ranked[0]
    base_config = base_of_variant(winner.config, longest)
    base = next((c for c in ranked if c.config == base_config), None)
    gain = f": {winner.rate / base.rate:.2f}x" if base is not None and base.rate else ""
    return (f"a squares cap at max_tokens={base_config.max_tokens if base_config else '?'}'s longest batch "
            f"({winner.config.max_squares} padded squares) lets the shorter batches hold up to "
            f"{winner.config.max_tokens} tokens{gain}")
