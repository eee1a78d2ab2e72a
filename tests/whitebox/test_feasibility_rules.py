"""What one probe implies for others: accumulation (gradients held beside the next forward), a selective
checkpoint policy that never runs, and a timeout (a stall rules out the smaller micro-batches of its strategy
alone; a start that timed out rules out none)."""

from __future__ import annotations

from autofit.config import Config
from autofit.planner import Observation, Planner, SearchSpace
from autofit.planner._feasibility import Feasibility

GiB = 2**30


def _obs(config: Config, status: str, peak: int | None = None) -> Observation:
    return Observation(config, status, peak_bytes=peak, rate=100.0 if status == "ok" else None)


def test_an_oom_with_accumulation_rules_out_nothing_without_it():
    space = SearchSpace.build(batch_range=(1, 64), precision=("fp32",), global_batch=64)
    feasible = Feasibility(space, GiB, [_obs(Config(batch_size=32, accumulation_steps=2), "oom")])
    assert not feasible.implied_too_big(Config(batch_size=64, accumulation_steps=1))  # no gradients held: unknown
    strategy = space.strategy_of(Config(batch_size=64, accumulation_steps=1))
    assert 64 in feasible.open_batches(strategy)


def test_an_oom_without_accumulation_rules_out_larger_batches_with_it():
    space = SearchSpace.build(batch_range=(1, 64), precision=("fp32",), accumulation_steps=(1, 2))
    feasible = Feasibility(space, GiB, [_obs(Config(batch_size=16), "oom")])
    assert feasible.implied_too_big(Config(batch_size=32, accumulation_steps=2))
    assert feasible.implied_too_big(Config(batch_size=16, accumulation_steps=2))


def test_a_fit_without_accumulation_implies_no_fit_with_it():
    space = SearchSpace.build(batch_range=(1, 64), precision=("fp32",), accumulation_steps=(1, 2))
    feasible = Feasibility(space, GiB, [_obs(Config(batch_size=32), "ok", 2**20)])
    with_accumulation = space.strategy_of(Config(batch_size=8, accumulation_steps=2))
    assert feasible.fit_max(space.strategy_of(Config(batch_size=8))) == 32
    assert feasible.fit_max(with_accumulation) is None


def test_selective_checkpointing_that_fails_for_a_reason_not_memory_is_abandoned():
    space = SearchSpace.build(batch_range=(1, 64), precision=("fp32",), checkpoint_segments=(0, 1, 2, 4),
                              checkpoint_policy=("full", "selective"))
    selective = Config(batch_size=8, checkpoint_segments=4, checkpoint_policy="selective")
    seen = [_obs(Config(batch_size=8), "ok", 2**20), _obs(selective, "error")]
    feasible = Feasibility(space, GiB, seen)
    assert feasible.strategy_unusable(space.strategy_of(Config(batch_size=8, checkpoint_segments=1, checkpoint_policy="selective")))
    assert not feasible.strategy_unusable(space.strategy_of(Config(batch_size=8, checkpoint_segments=1)))
    planner = Planner(space, GiB)
    proposed = planner.next(seen)
    assert proposed is None or proposed.checkpoint_policy != "selective" or not proposed.checkpoint_segments


def test_every_precision_is_probed_once_the_pilot_climbed_and_the_faster_explored_first():
    """A short budget still compares precisions: once the pilot's strategy has climbed to its memory edge
    (here the top of the space), the next probe is the other precision's first batch, at the climbed one,
    and the one measured faster is the one whose batches are explored next."""
    from autofit.planner import Observation, Planner, SearchSpace

    space = SearchSpace.build(batch_range=(8, 512), precision=("fp32", "bf16"))
    planner = Planner(space, 64 * 2**30, check_noise=False)
    pilot = planner.next([])
    seen = [Observation(pilot, "ok", peak_bytes=2**30, rate=100.0, wall_s=1.0, phase="explore")]
    while (climb := planner.next(seen)).precision == pilot.precision:
        assert climb.batch_size > seen[-1].config.batch_size and len(seen) < 6
        seen.append(Observation(climb, "ok", peak_bytes=2**30 + climb.batch_size * 2**24, rate=100.0 + climb.batch_size,
                                wall_s=1.0, phase="explore"))
    top = seen[-1].config.batch_size
    assert len(seen) >= 2 and top == 512
    second = climb
    assert (second.precision, second.batch_size) == ("bf16", top)
    seen.append(Observation(second, "ok", peak_bytes=2**30, rate=1800.0, wall_s=1.0, phase="explore"))
    assert planner.next(seen).precision == "bf16"  # measured 3x faster: its other batches first
    seen[-1] = Observation(second, "ok", peak_bytes=2**30, rate=60.0, wall_s=1.0, phase="explore")
    assert planner.next(seen).precision == "fp32"


def test_a_selective_policy_that_runs_out_of_memory_is_not_abandoned():
    from autofit.planner import Observation, Strategy
    from autofit.planner._feasibility import Feasibility

    space = _selective_space()
    seen = [Observation(Config(batch_size=64), "ok", peak_bytes=2**30, rate=640.0),
            Observation(Config(batch_size=64, checkpoint_segments=1, checkpoint_policy="selective"), "oom"),
            Observation(Config(batch_size=8, checkpoint_segments=2, checkpoint_policy="selective"), "crashed")]
    assert not Feasibility(space, 8 * GiB, seen).strategy_unusable(Strategy(precision="fp32", checkpoint_segments=4, accumulation_steps=1, checkpoint_policy="selective"))


def test_an_oom_while_accumulating_implies_nothing_for_one_micro_batch_a_step():
    """Accumulating keeps the gradients alive through the next micro-batch's forward; one micro-batch a
    step holds none then. So an OOM at (G/2, acc=2) says nothing of (G, acc=1), and the reverse holds."""
    from autofit.planner import Observation
    from autofit.planner._feasibility import Feasibility

    space = SearchSpace.build(batch_range=(4, 64), precision=("fp32",), global_batch=64)
    strategy = space.strategies()[0]
    feasible = Feasibility(space, 8 * GiB, [Observation(Config(batch_size=32, accumulation_steps=2), "oom")])
    assert not feasible.implied_too_big(Config(batch_size=64))
    assert 64 in feasible.open_batches(strategy) and 32 not in feasible.open_batches(strategy)
    fit = Feasibility(space, 8 * GiB, [Observation(Config(batch_size=64), "ok", peak_bytes=GiB, rate=1.0)])
    assert 32 in fit.open_batches(strategy)  # a fit without held gradients says nothing of accumulating


def test_accumulation_orders_memory_one_way_at_one_micro_batch():
    from autofit.planner import Observation, Strategy
    from autofit.planner._feasibility import Feasibility

    space = SearchSpace.build(batch_range=(8, 64), precision=("fp32",), accumulation_steps=(1, 2, 4))
    one, two, four = (Strategy(precision="fp32", checkpoint_segments=0, accumulation_steps=a) for a in (1, 2, 4))

    def feasible(config: Config, status: str) -> Feasibility:
        return Feasibility(space, 8 * GiB, [Observation(config, status, peak_bytes=GiB, rate=1.0)])

    oom_accumulating = feasible(Config(batch_size=32, accumulation_steps=2), "oom")
    assert oom_accumulating.oom_min(one) is None and not oom_accumulating.implied_too_big(Config(batch_size=64))
    assert oom_accumulating.oom_min(four) == 32  # as much held at acc=4: the same memory
    assert feasible(Config(batch_size=32), "oom").oom_min(two) == 32  # acc=1 ran out: accumulating needs more
    assert feasible(Config(batch_size=32), "ok").fit_max(two) is None  # acc=1 fits: accumulating may not
    assert feasible(Config(batch_size=32, accumulation_steps=4), "ok").fit_max(one) == 32


def _selective_space() -> SearchSpace:
    return SearchSpace.build(batch_range=(8, 64), precision=("fp32",), checkpoint_segments=(0, 1, 2, 4),
                             checkpoint_policy=("full", "selective"))


GLOBAL = 480
TIMEOUT_SPACE = SearchSpace.build(batch_range=(1, GLOBAL), precision=("bf16", "fp32"), global_batch=GLOBAL,
                                  compile=(False, True))


def _at(batch: int, precision: str, compile: bool) -> Config:
    return Config(batch_size=batch, precision=precision, compile=compile, accumulation_steps=GLOBAL // batch)


def _timed_out(config: Config, *, stalled: bool) -> Feasibility:
    return Feasibility(TIMEOUT_SPACE, 72 * GiB, [Observation(config, "timeout", wall_s=60.0, stalled=stalled)])


def test_a_start_timeout_rules_out_no_smaller_micro_batch():
    """Issue 44, item 8: one compiled bf16 b=32 start timeout removed fp32 eager b<=16. A start that timed out is
    compilation or the script's own evaluation, which grow with b if anything, and a probe runs 4 micro-batches at
    most: a smaller b is no longer a longer probe."""
    feasible = _timed_out(_at(32, "bf16", True), stalled=False)
    for batch in (16, 8):
        assert not feasible.implied_too_slow(_at(batch, "fp32", False))
        assert not feasible.implied_too_slow(_at(batch, "bf16", True))


def test_a_stall_rules_out_the_smaller_micro_batches_of_its_own_strategy_only():
    """A micro-batch of b made no progress for the stall limit: a smaller one of its strategy (more micro-batches
    a step, none faster per sample) is not worth a probe; another precision, compile or a larger b still is."""
    feasible = _timed_out(_at(32, "bf16", True), stalled=True)
    assert feasible.implied_too_slow(_at(16, "bf16", True))
    assert 16 not in feasible.open_batches(TIMEOUT_SPACE.strategy_of(_at(16, "bf16", True)))
    assert not feasible.implied_too_slow(_at(48, "bf16", True))
    assert not feasible.implied_too_slow(_at(16, "fp32", False))
    assert not feasible.implied_too_slow(_at(16, "bf16", False))
    assert 16 in feasible.open_batches(TIMEOUT_SPACE.strategy_of(_at(16, "fp32", False)))
