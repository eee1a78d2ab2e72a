"""Activation offload is searched as what it is, a trade: device memory for host transfers. The planner
measures it where the function offers blocks on an accelerator, keeps it where a larger micro-batch it lets
fit is faster, and leaves it where the transfers cost more than the batch gains (issue 47: the search
measures whether it pays). GPU-like landscapes, as in test_pilot_climb: a step's fixed cost (launches, the
optimizer) and a per-sample cost, activations per sample that offload moves to the host."""

from __future__ import annotations

import pytest

from autofit.config import Config
from autofit.planner import Observation, Planner, SearchSpace

GiB, MiB = 2**30, 2**20
USABLE = 16 * GiB
FIXED_BYTES = 4 * GiB  # weights, gradients, optimizer state: on the device either way
PER_SAMPLE_BYTES = 512 * MiB  # activations: offload keeps a tenth of them on the device


def _peak(config: Config) -> float:
    kept = 0.1 if config.offload_activations else 1.0
    return FIXED_BYTES + config.batch_size * PER_SAMPLE_BYTES * kept


def _landscape(launch_s: float, sample_s: float, offload_cost: float):
    """A probe of the landscape: OOM above the memory line, else throughput b / (launch + b x per-sample),
    the per-sample cost `offload_cost` times higher with offload."""
    def probe(config: Config) -> Observation:
        if _peak(config) > USABLE:
            return Observation(config, "oom", wall_s=1.0)
        per_sample = sample_s * (offload_cost if config.offload_activations else 1.0)
        rate = config.batch_size / (launch_s + config.batch_size * per_sample)
        return Observation(config, "ok", peak_bytes=int(_peak(config)), rate=rate, wall_s=1.0, spread=0.02)
    return probe


def _search(probe) -> tuple[Config, list[Observation]]:
    space = SearchSpace.build(batch_range=(1, 512), precision=("bf16",), offload_activations=(False, True))
    planner = Planner(space, USABLE, check_noise=False)
    seen: list[Observation] = []
    while (config := planner.next(seen)) is not None:
        assert len(seen) < 80, "the planner did not finish"
        seen.append(probe(config))
    return planner.best(seen), seen


def _true_best(probe) -> Config:
    configs = [Config(batch_size=b, precision="bf16", offload_activations=o) for b in range(1, 513) for o in (False, True)]
    return max((c for c in configs if probe(c).status == "ok"), key=lambda c: probe(c).rate)


def test_where_the_memory_edge_holds_the_batch_far_below_saturation_offload_is_measured_and_kept():
    """A launch-bound step (40 ms fixed, 0.5 ms a sample): without offload 24 samples fit; with it 240 do, and
    even at 1.5x the per-sample cost the larger batch runs about three times faster."""
    probe = _landscape(launch_s=0.040, sample_s=0.0005, offload_cost=1.5)
    best, seen = _search(probe)
    assert any(o.config.offload_activations for o in seen)
    assert best.offload_activations
    assert probe(best).rate >= 0.9 * probe(_true_best(probe)).rate


@pytest.mark.parametrize("offload_cost", [1.6, 2.5])
def test_where_the_batch_saturates_below_the_memory_edge_offload_is_left(offload_cost):
    """A compute-bound step (1 ms fixed, 2 ms a sample): throughput is flat long before the memory edge, so
    the transfers' cost is all offload adds: the pick keeps its activations on the device."""
    probe = _landscape(launch_s=0.001, sample_s=0.002, offload_cost=offload_cost)
    best, _ = _search(probe)
    assert not best.offload_activations
    assert probe(best).rate >= 0.9 * probe(_true_best(probe)).rate
