"""Trust, round four (issue 44), at the planner: an A/B round the budget cut short is not measured, so a resumed
search confirms the leader (item 7); after an A/B, configs rank like with like, short figures against short ones
(item 10). Item 8 (timeouts and smaller micro-batches): tests/whitebox/test_feasibility_rules.py."""

from __future__ import annotations

import pytest

from autofit.config import Config
from autofit.planner import ABPlan, Observation, Planner, SearchSpace

GiB = 2**30
SPACE = SearchSpace.build(batch_range=(8, 64), precision=("fp32",))


def _ok(config: Config | int, rate: float, phase: str = "explore", trial: int | None = None) -> Observation:
    """A probe that ran; every config peaks alike, so near-ties (`TIE_TOLERANCE`) go to the faster."""
    config = Config(batch_size=config) if isinstance(config, int) else config
    return Observation(config, "ok", peak_bytes=2**26, rate=rate, wall_s=1.0, phase=phase, spread=0.02, trial=trial)


def _cut(batch: int, trial: int | None = None) -> Observation:
    """An A/B round the search's budget ended (`BudgetCut`): nothing measured."""
    return Observation(Config(batch_size=batch), "timeout", wall_s=30.0, phase="confirm", trial=trial, cut=True)


# --- item 7: a cut round is not measured --------------------------------------------------------------------
def test_a_leader_whose_a_b_round_the_budget_cut_is_still_an_entrant_on_resume():
    """b=64's only confirmation round was cut: it has no confirmation, so a resumed search runs its A/B (the old
    code read the cut round as the winner's confirmation: no entrants, the leader never confirmed)."""
    planner = Planner(SPACE, GiB)
    seen = [_ok(16, 60.0), _ok(16, 54.0, "recheck"), _ok(48, 95.0), _ok(64, 100.0), _cut(64)]
    assert planner.ab_entrants(seen) == [Config(batch_size=64), Config(batch_size=48)]
    assert planner.to_confirm(seen) == Config(batch_size=64)


def test_a_cut_round_neither_counts_as_a_round_nor_drops_its_entrant():
    """The cut round measured nothing and failed nothing: b=48 runs its round again and stays in the A/B."""
    plan = ABPlan((Config(batch_size=64), Config(batch_size=48)), rounds=2, steps=20)
    seen = [_ok(64, 90.0, "confirm", trial=1), _cut(48, trial=2)]
    assert plan.next(seen) == Config(batch_size=48)
    seen += [_ok(48, 88.0, "confirm", trial=3), _ok(64, 91.0, "confirm", trial=4)]
    assert plan.next(seen) == Config(batch_size=48)  # one measured round each so far: b=48's second is due


# --- item 10: like with like after an A/B --------------------------------------------------------------------
def test_a_config_measured_once_ranks_at_the_a_b_s_scale_not_above_its_entrants():
    """The issue's search: both entrants' A/B rounds read 4.5% under their short probes; b=32, measured once,
    read 100 like the leader. Against the entrants' A/B figures (95.5) it won; at the A/B's scale it is 95.5 too
    and b=64, which led b=32 on short probes (101 against 100), keeps the lead."""
    planner = Planner(SPACE, GiB, check_noise=False)
    seen = [_ok(64, 101.0), _ok(48, 100.5), _ok(32, 100.0),
            *[_ok(64, 101.0 * 0.955, "confirm") for _ in range(3)], *[_ok(48, 100.5 * 0.955, "confirm")
                                                                       for _ in range(3)]]
    ranked = planner.ranked(seen)
    assert [c.config.batch_size for c in ranked] == [64, 48, 32]
    b32 = ranked[2]
    assert b32.rate == 100.0 and b32.standing == pytest.approx(95.5)  # its measured figure stays its figure
    # 100 reads faster than b=64's rounds beyond the noise (2%): b=32 is measured as long in turn, where the
    # budget allows
    assert planner.ab_entrants(seen) == [Config(batch_size=32)]
    seen += [_ok(32, 95.5, "confirm") for _ in range(3)]  # its rounds fall as theirs did
    assert planner.best(seen) == Config(batch_size=64) and planner.ab_entrants(seen) == []


def test_the_a_b_still_orders_its_own_entrants_by_their_rounds():
    """b=48 ran faster than b=64 in the A/B's rounds: it wins, whatever the short probes said; the config
    measured once compares at the A/B's ratio (the median of the entrants': 0.925): 92.5, between them."""
    planner = Planner(SPACE, GiB, check_noise=False)
    seen = [_ok(64, 100.0), _ok(48, 100.0), _ok(32, 100.0),
            _ok(64, 89.0, "confirm"), _ok(48, 96.0, "confirm")]
    ranked = planner.ranked(seen)
    assert [c.config.batch_size for c in ranked] == [48, 32, 64]
    assert ranked[1].standing == pytest.approx(92.5)
