"""The climb toward the memory edge takes a fit whose measured steps needed the allocator's retries (CUDA's
num_alloc_retries: it freed its cache to stay under the cap) for the edge: nothing larger of its kind is probed
(published: throughput collapses where a run keeps retrying, Composer PR #1998)."""

from __future__ import annotations

from autofit.config import Config
from autofit.planner import Observation, Planner, SearchSpace

GiB = 2**30
SPACE = SearchSpace.build(batch_range=(1, 1024), precision=("fp32",))


def _climbed(tight: bool) -> list[Observation]:
    """b=32 and b=64 ran far below the usable memory, b=64 the faster: a climb that goes on, unless b=64's
    measured steps needed retries."""
    return [Observation(Config(batch_size=32), "ok", peak_bytes=1 * GiB, rate=300.0, spread=0.01),
            Observation(Config(batch_size=64), "ok", peak_bytes=2 * GiB, rate=500.0, spread=0.01, tight=tight)]


def test_a_fit_that_needed_retries_in_its_measured_steps_is_the_top_of_its_climb():
    planner = Planner(SPACE, 10 * GiB, check_noise=False)
    assert planner.leader_can_climb(_climbed(tight=False))
    assert planner.next(_climbed(tight=False)).batch_size > 64
    assert not planner.leader_can_climb(_climbed(tight=True))
    following = planner.next(_climbed(tight=True))
    assert following is None or following.batch_size < 64
    assert planner.best(_climbed(tight=True)) == Config(batch_size=64)  # it ran: still the answer
