"""The planner's order of memory and recompute by activation checkpointing (autofit.planner._search_space, _feasibility)
and the policies a search considers (autofit.search._build_space): pure logic, no probes."""

from __future__ import annotations

import pytest

from autofit.config import Config
from autofit.planner import Observation, Planner, SearchSpace, Strategy
from autofit.planner._feasibility import Feasibility
from autofit.planner._recompute import needs_no_more_memory, recomputes_no_more

MiB = 2**20


# --- the planner ------------------------------------------------------------------------------
def _strategy(k: int, policy: str = "full") -> Strategy:
    return Strategy(precision="fp32", checkpoint_segments=k, accumulation_steps=1, checkpoint_policy=policy)


def test_memory_is_ordered_by_blocks_and_policy_and_unknown_across():
    none, full2, full4 = _strategy(0), _strategy(2), _strategy(4)
    selective2, selective4 = _strategy(2, "selective"), _strategy(4, "selective")
    # Full below selective below none, at as many blocks or more; one policy: more blocks, less memory.
    for lower, higher in ((full2, selective2), (selective2, none), (full2, none), (full4, selective2),
                          (selective4, selective2), (full4, full2), (selective4, none)):
        assert needs_no_more_memory(lower, higher) and not needs_no_more_memory(higher, lower), (lower, higher)
    # Selective on more blocks than full: either may need more.
    assert not needs_no_more_memory(selective4, full2) and not needs_no_more_memory(full2, selective4)
    # Recompute: none, then selective, then full; selective on more blocks than full, unknown.
    assert recomputes_no_more(none, selective2) and recomputes_no_more(selective2, full2)
    assert recomputes_no_more(selective2, full4) and not recomputes_no_more(full2, selective2)
    assert not recomputes_no_more(selective4, full2) and not recomputes_no_more(full2, selective4)


def _space() -> SearchSpace:
    return SearchSpace.build(batch_range=(8, 256), precision=("fp32",), checkpoint_segments=(0, 1, 2, 4),
                             checkpoint_policy=("full", "selective"))


def test_an_oom_implies_oom_only_where_checkpointing_needs_no_less_memory():
    space = _space()
    oom = Observation(Config(batch_size=64, checkpoint_segments=4, checkpoint_policy="selective"), "oom")
    feasible = Feasibility(space, 1e9, [oom])
    implied = {s.label() for s in space.strategies() if feasible.implied_too_big(space.config(s, 64))}
    assert implied == {"fp32", "fp32 ckpt=1 selective", "fp32 ckpt=2 selective", "fp32 ckpt=4 selective"}
    assert not feasible.implied_too_big(space.config(_strategy(4, "selective"), 32))


def test_a_fit_implies_fits_only_where_checkpointing_needs_no_more_memory():
    space = _space()
    fit = Observation(Config(batch_size=64, checkpoint_segments=2, checkpoint_policy="selective"), "ok", peak_bytes=5e8,
                      rate=10.0)
    feasible = Feasibility(space, 1e9, [fit])
    fits = {s.label() for s in space.strategies() if feasible.fit_max(s) == 64}
    assert fits == {"fp32 ckpt=2", "fp32 ckpt=4", "fp32 ckpt=2 selective", "fp32 ckpt=4 selective"}


def test_a_space_without_blocks_or_selective_is_the_space_it_was():
    assert SearchSpace.build(batch_range=(8, 64), precision=("fp32",), checkpoint_policy=("full", "selective")
                             ).values_of("checkpoint_policy") == ("full",)
    old = SearchSpace.build(batch_range=(8, 64), precision=("fp32",), checkpoint_segments=(0, 1, 2, 4))
    assert "checkpoint_policies" not in old.to_dict()
    assert [s.checkpoint_policy for s in old.strategies()] == ["full"] * 4
    both = _space()
    assert SearchSpace.from_dict(both.to_dict()) == both
    labels = [s.label() for s in Planner(both, 1e9)._order(Planner(both, 1e9)._state([]))]
    assert labels == ["fp32", "fp32 ckpt=1 selective", "fp32 ckpt=1", "fp32 ckpt=2 selective", "fp32 ckpt=2",
                      "fp32 ckpt=4 selective", "fp32 ckpt=4"]


@pytest.mark.parametrize("winner", ["selective", "full"])
def test_the_planner_finds_the_policy_that_wins_and_implies_only_along_the_order(winner: str):
    """Selective checkpointing of every block fits twice none's batch, full four times it. Where the
    pace saturates early, selective (99% of none's pace) wins; where it saturates late, full (98%)
    does, at a batch selective cannot reach: an OOM of selective there must not stop full. The
    planner must reach the winner, and never probe a config an earlier probe implies too big under
    the order of rule 1."""
    import sys

    from tests.support import REPO

    sys.path.insert(0, REPO)
    from benchmarks.landscape import synthetic

    space = SearchSpace.build(batch_range=(8, 1024), precision=("fp32",), checkpoint_segments=(0, 1, 2, 4),
                              checkpoint_policy=("full", "selective"))
    saturation = 24 if winner == "selective" else 4000

    def peak(c: Config) -> float:
        kept = 0.1 if c.checkpoint_policy == "selective" else 0.2
        return (300 + 6.0 * (1 - kept * c.checkpoint_segments) * c.batch_size) * MiB

    def rate(c: Config) -> float:
        slowdown = 0.0025 if c.checkpoint_policy == "selective" else (0.1 if winner == "selective" else 0.005)
        return 100.0 / (1 + slowdown * c.checkpoint_segments) * c.batch_size / (c.batch_size + saturation)

    land = synthetic("policies", space, 1536 * MiB, 0.1, peak, rate, baseline_bytes=250 * MiB)
    planner = Planner(space, land.usable_bytes)
    observations: list[Observation] = []
    while (config := planner.next(observations)) is not None:
        assert len(observations) < len(land.configs()) / 2, "the planner did not finish"
        assert not any(o.too_big(land.usable_bytes) and needs_no_more_memory(o.config, config)
                       and config.batch_size >= o.config.batch_size for o in observations), config.label()
        observations.append(land.probe(config))
    best = planner.best(observations)
    assert best.checkpoint_policy == winner and best.checkpoint_segments == 4, best.label()
    assert land.true_throughput(best) >= 0.97 * land.best_throughput()


@pytest.mark.parametrize("declared,flag,expected", [
    (None, None, ("full", "selective")),  # a function that offers run.checkpoint(): both by default
    (("full",), None, ("full",)),  # @autofit(checkpoint_policy="full")
    (None, ("selective",), ("selective",)),  # --checkpoint-policy selective
    (("full",), ("full", "selective"), ("full", "selective")),  # the command line wins
])
def test_the_policies_a_search_considers(declared, flag, expected):
    from autofit.options import SearchOptions
    from autofit.probing import WorkerInfo
    from autofit.search import SearchSettings
    from autofit.knobs import Offers
    from autofit.search._build_space import build_space, search_options

    info = WorkerInfo(function="train", options=SearchOptions(consider={"checkpoint_policy": declared}).__dict__,
                      device={"type": "cpu"}, precisions=["fp32"], default_precisions=["fp32"], baseline_bytes=0,
                      memory_limit=None, versions={}, load_s=0.0, pid=0)
    settings = SearchSettings(script="train.py", consider={"checkpoint_policy": flag})
    options = search_options(info, settings)
    space = build_space(settings, options, info, Offers.from_dict({"checkpoint_blocks": 4, "autocast": True, "backward": True}))
    assert space.values_of("checkpoint_policy") == expected
    assert {c.checkpoint_policy for c in space.configs() if c.checkpoint_segments} == set(expected)
    unoffered = build_space(settings, options, info, Offers.from_dict({"checkpoint_blocks": None, "autocast": True}))
    assert unoffered.values_of("checkpoint_policy") == ("full",) and {c.checkpoint_policy for c in unoffered.configs()} == {"full"}
