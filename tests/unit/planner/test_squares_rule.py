"""Rule 7: per-length token caps. The leader by tokens is probed with larger token caps under a squares cap at
its worst batch's (T x L), only where that can pay: the memory its short batches leave is used where the
quadratic term holds the long ones, and nothing is probed where larger batches are no faster.

A simulated script: a batch's memory is a + b x tokens + c x squares (the caps' worst, as a probe's worst-first
batches reach them), its tokens/s rises with the tokens a typical batch holds and saturates."""

from __future__ import annotations

from autofit import Config
from autofit.planner import Observation, Planner, SearchSpace, squares_reason

MiB = 2**20
LONGEST = 256
SPACE = SearchSpace.build(batch_range=(1, 2**20), token_range=(LONGEST, 2**15), precision=("fp32",),
                          longest_sample=LONGEST)
TYPICAL = 64  # the length most batches are cut at


def _peak(config: Config, a: float, b: float, c: float) -> float:
    squares = config.max_tokens * LONGEST if config.max_squares is None else config.max_squares
    return a + b * config.max_tokens + c * min(squares, config.max_tokens * LONGEST)


def _typical_tokens(config: Config) -> float:
    """The padded tokens of a typical batch: the token cap, or what the squares cap leaves at its length."""
    if config.max_squares is None:
        return config.max_tokens
    return min(config.max_tokens, config.max_squares / TYPICAL)


def _measure(config: Config, *, usable: float, a: float, b: float, c: float, saturation: float) -> Observation:
    peak = _peak(config, a, b, c)
    if peak > usable * 1.2:
        return Observation(config, "oom")
    tokens = _typical_tokens(config)
    return Observation(config, "ok", peak_bytes=int(peak), rate=1e5 * tokens / (tokens + saturation), spread=0.01)


def _search(usable: float, **model) -> list[Observation]:
    planner, seen = Planner(SPACE, usable, check_noise=False), []
    for _ in range(80):
        config = planner.next(seen)
        if config is None:
            return seen
        seen.append(_measure(config, usable=usable, **model))
    raise AssertionError("the planner never stopped")


def test_where_attention_holds_the_long_batches_the_short_ones_hold_more_tokens():
    usable = 600 * MiB  # a + b x 2048 + c x 2048 x 256 = 560 MiB: the leader is memory-bound at 2048
    model = {"a": 300 * MiB, "b": 8_000, "c": 460, "saturation": 8192}
    seen = _search(usable, **model)
    planner = Planner(SPACE, usable, check_noise=False)
    best = planner.best(seen)
    leader = max((o.config for o in seen if o.config.max_squares is None and o.fits(usable)), key=lambda c: c.size)
    assert best.max_squares == leader.max_tokens * LONGEST  # the long batches stay as the leader's
    assert best.max_tokens > leader.max_tokens and _peak(best, **{k: model[k] for k in "abc"}) <= usable
    variants = [o for o in seen if o.config.max_squares is not None]
    assert 1 <= len(variants) <= 4  # the line through the leader's peak leads the climb
    reason = squares_reason(planner.ranked(seen), LONGEST)
    assert reason is not None and f"max_tokens={leader.max_tokens}" in reason and "x" in reason


def test_where_memory_is_linear_in_tokens_one_variant_is_probed_and_none_wins():
    usable = 600 * MiB
    model = {"a": 300 * MiB, "b": 150_000, "c": 0, "saturation": 8192}
    seen = _search(usable, **model)
    variants = [o for o in seen if o.config.max_squares is not None]
    assert len(variants) == 1 and not variants[0].fits(usable)
    assert Planner(SPACE, usable, check_noise=False).best(seen).max_squares is None


def test_where_a_larger_cap_fit_and_ran_no_faster_no_variant_is_probed():
    usable = 4096 * MiB  # memory is not what stops the climb: the steps are saturated
    model = {"a": 300 * MiB, "b": 8_000, "c": 460, "saturation": 64}
    seen = _search(usable, **model)
    assert not [o for o in seen if o.config.max_squares is not None]


def test_variants_stay_out_of_the_strategy_s_memory_line_and_what_fits():
    """A variant's peak is not its token cap's: it must not bend the line nor imply a fit."""
    usable = 600 * MiB
    strategy = SPACE.strategies()[0]
    small, leader, big = (SPACE.config(strategy, t) for t in (1024, 2048, 4096))
    seen = [Observation(small, "ok", peak_bytes=400 * MiB, rate=10.0, spread=0.01),
            Observation(leader, "ok", peak_bytes=560 * MiB, rate=11.0, spread=0.01),
            Observation(big, "oom")]
    planner = Planner(SPACE, usable, check_noise=False)
    line_before = planner.memory_line(strategy, seen)
    variant = Config(batch_size=4096, max_tokens=4096, max_squares=2048 * LONGEST)
    seen.append(Observation(variant, "ok", peak_bytes=580 * MiB, rate=13.0, spread=0.01))
    assert planner.memory_line(strategy, seen) == line_before
    assert planner.best(seen) == variant
    assert planner.next(seen) != big
