"""Trust, round three (issue 37), at the planner: a resumed study's probes outside the space asked for are
never ranked (item 1), and dominance uses the noise measured, never a 10% floor; a tight config dominates
nothing, and configs within the noise meet in the A/B (item 2)."""

from __future__ import annotations

from autofit.config import Config
from autofit.planner import Observation, Planner, SearchSpace

GiB = 2**30


def _ok(config: Config, rate: float, *, tight: bool = False, phase: str = "explore", spread: float = 0.01,
        peak: int = GiB) -> Observation:
    return Observation(config, "ok", peak_bytes=peak, rate=rate, wall_s=5.0, phase=phase, spread=spread, tight=tight)


def test_a_resumed_study_ranks_only_the_configs_of_the_space_asked_for():
    """The study holds bf16 probes at a global batch of 480; the search now asks for fp32 at 240: its export
    must be a config of that space, never bf16 b=48 acc=10 (global batch 480)."""
    old = [_ok(Config(batch_size=48, precision="bf16", accumulation_steps=10), 900.0), _ok(Config(batch_size=24, precision="bf16", accumulation_steps=20), 800.0)]
    space = SearchSpace.build(batch_range=(1, 240), precision=("fp32",), global_batch=240)
    planner = Planner(space, 72 * GiB, check_noise=False)
    assert planner.best(old) is None
    fp32 = _ok(Config(batch_size=24, precision="fp32", accumulation_steps=10), 300.0)
    assert planner.best([*old, fp32]) == fp32.config and space.contains(fp32.config)
    assert planner.next(old) is not None  # and the search goes on in its own space


def test_dominance_uses_the_noise_measured_not_a_ten_percent_floor():
    """Repeats of one config agreeing within 1%: a micro-batch 6% faster than the larger one it yields to
    under the expert's order (less accumulation) is faster beyond that noise, and ranks first."""
    space = SearchSpace.build(batch_range=(1, 480), precision=("fp32",), global_batch=480)
    planner = Planner(space, 72 * GiB, check_noise=False)
    b48, b60 = Config(batch_size=48, accumulation_steps=10), Config(batch_size=60, accumulation_steps=8)
    seen = [_ok(b48, 106.0), _ok(b48, 106.5, phase="recheck"), _ok(b60, 100.0), _ok(b60, 100.4, phase="recheck")]
    assert planner.ranking_margin(seen) < 0.06
    assert planner.best(seen) == b48


def test_a_tight_config_dominates_nothing():
    """The reproduction: b=48 at 136.0/135.5 samples/s, b=60 at 125.5/125.0 but only just fitting (allocator
    retries): b=60 must not win by dominance, and b=48 is an A/B entrant."""
    space = SearchSpace.build(batch_range=(1, 480), precision=("fp32",), global_batch=480)
    planner = Planner(space, 72 * GiB, check_noise=False)
    b48, b60 = Config(batch_size=48, accumulation_steps=10), Config(batch_size=60, accumulation_steps=8)
    seen = [_ok(b48, 136.0), _ok(b48, 135.5, phase="recheck"),
            _ok(b60, 125.5, tight=True), _ok(b60, 125.0, tight=True, phase="recheck")]
    assert planner.best(seen) == b48
    assert b48 in planner.ab_entrants(seen)


def test_a_config_within_the_noise_that_another_dominates_still_meets_it_in_the_a_b():
    """b=48 reads 3% faster than b=60 (within a noise of 10% measured by repeats): dominance ranks b=60 first,
    and the A/B, not the rule, decides between them."""
    space = SearchSpace.build(batch_range=(1, 480), precision=("fp32",), global_batch=480)
    planner = Planner(space, 72 * GiB, check_noise=False)
    b48, b60 = Config(batch_size=48, accumulation_steps=10), Config(batch_size=60, accumulation_steps=8)
    b24 = Config(batch_size=24, accumulation_steps=20)
    seen = [_ok(b48, 103.0), _ok(b60, 100.0), _ok(b24, 90.0), _ok(b24, 81.0, phase="recheck")]
    assert planner.best(seen) == b60
    assert planner.ab_entrants(seen) == [b60, b48]
