"""A timeout is a speed fact, not a verdict (issue "Priced for the GPU"): on an H100, nanoGPT's pilot and the
next probe timed out while compiling, two failures made every strategy unusable, and the search ended with
nothing measured. Here, at the planner: two timeouts never end a search, a timeout never makes a precision
unusable, at a fixed global batch a stall never leads to a smaller micro-batch of its strategy, and with nothing
measured the timed-out config is probed again rather than the search ending."""

from __future__ import annotations

from autofit.config import Config
from autofit.planner import Observation, Planner, SearchSpace

GiB = 2**30
#: nanoGPT's defaults: 480 samples a step.
GLOBAL = 480


def _space() -> SearchSpace:
    return SearchSpace.build(batch_range=(1, GLOBAL), precision=("bf16", "fp32"), global_batch=GLOBAL)


def _timeout(config: Config, stalled: bool = False) -> Observation:
    return Observation(config, "timeout", wall_s=60.0, stalled=stalled)


def test_two_timeouts_never_end_a_search():
    planner = Planner(_space(), 72 * GiB, check_noise=False)
    pilot = planner.next([])
    seen = [_timeout(pilot)]
    second = planner.next(seen)
    assert second is not None
    seen.append(_timeout(second))
    assert planner.next(seen) is not None
    assert planner.unusable_precisions(seen) == set()


def test_a_timeout_never_makes_a_precision_unusable_where_an_error_would():
    space = _space()
    planner = Planner(space, 72 * GiB, check_noise=False)
    bf16 = [Config(batch_size=32, precision="bf16", accumulation_steps=15), Config(batch_size=48, precision="bf16", accumulation_steps=10)]
    assert planner.unusable_precisions([_timeout(c) for c in bf16]) == set()
    assert planner.unusable_precisions([Observation(c, "error") for c in bf16]) == {"bf16"}


def test_at_a_fixed_global_batch_a_stall_never_leads_to_a_smaller_micro_batch_of_its_strategy():
    """A micro-batch of the pilot (b=4 acc=120) made no progress for the stall limit: no later probe of its
    strategy goes below b (its step holds more micro-batches, none faster per sample). A start that timed out
    rules out nothing (issue 44: tests/whitebox/test_feasibility_rules.py)."""
    space = _space()
    planner = Planner(space, 72 * GiB, check_noise=False)
    pilot = planner.next([])
    seen = [_timeout(pilot, stalled=True)]
    for _ in range(6):
        config = planner.next(seen)
        if config is None:
            break
        assert space.strategy_of(config) != space.strategy_of(pilot) or config.batch_size >= pilot.batch_size, \
            f"{config.label()} after {pilot.label()} stalled"
        seen.append(_timeout(config, stalled=True) if config.batch_size == pilot.batch_size else
                    Observation(config, "ok", peak_bytes=GiB * config.batch_size // 4, rate=float(config.batch_size),
                                wall_s=5.0))


def test_with_nothing_measured_a_timed_out_config_is_probed_again_once():
    """The space has one config left to try; it timed out: it is probed again (the search gives it what its
    budget has left), once, instead of the search ending with nothing measured."""
    space = SearchSpace.build(batch_range=(8, 8), precision=("fp32",))
    planner = Planner(space, 8 * GiB, check_noise=False)
    only = planner.next([])
    assert planner.next([_timeout(only)]) == only
    assert planner.next([_timeout(only), _timeout(only)]) is None


def test_a_probe_the_budget_cut_short_decides_nothing():
    """Cut by the budget's end (`Observation.cut`): not tried, not failed; a resumed search probes it."""
    space = SearchSpace.build(batch_range=(8, 8), precision=("fp32",))
    planner = Planner(space, 8 * GiB, check_noise=False)
    only = planner.next([])
    cut = Observation(only, "timeout", wall_s=30.0, cut=True)
    assert planner.next([cut]) == only
    assert not cut.failed and not cut.timed_out
