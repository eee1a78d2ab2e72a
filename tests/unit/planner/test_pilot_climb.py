"""The pilot's strategy climbs before the other precisions are probed, and they are probed at the batch it
reached: on a GPU every precision reads alike at the pilot's batch (its step is launch-bound), while the
batch moves throughput 10-100x (the 30 s search on an H100 that never left b=4, benchmarks/gpu.md)."""

from __future__ import annotations

import pytest

from autofit.config import Config
from autofit.memory import peak_factors
from autofit.planner import MemoryPrediction, Observation, Planner, SearchSpace

GiB, MiB = 2**30, 2**20
USABLE = 70 * GiB
#: A GPU-like landscape: per-sample memory and compute by precision (16-bit autocast halves activations).
PER_SAMPLE_BYTES = {"fp32": 60 * MiB, "tf32": 60 * MiB, "bf16": 36 * MiB, "fp16": 36 * MiB}
PER_SAMPLE_S = {"fp32": 12e-6, "tf32": 10e-6, "bf16": 8e-6, "fp16": 8.4e-6}
LAUNCH_S = 5e-3  # a step's fixed cost: kernel launches, the optimizer; at b=4 it is nearly all of it


def _space(batch_range: tuple[int, int] = (1, 2048)) -> SearchSpace:
    return SearchSpace.build(batch_range=batch_range, precision=("bf16", "fp32", "tf32", "fp16"))


def _peak(config: Config) -> float:
    return 2 * GiB + config.batch_size * PER_SAMPLE_BYTES[config.precision]


def _probe(config: Config) -> Observation:
    """Throughput near-linear in batch up to the memory line; the precisions equal (within 1%) at b=4."""
    peak = _peak(config)
    if peak > USABLE:
        return Observation(config, "oom", wall_s=1.0)
    rate = config.batch_size / (LAUNCH_S + config.batch_size * PER_SAMPLE_S[config.precision])
    return Observation(config, "ok", peak_bytes=int(peak), rate=rate, wall_s=1.0, spread=0.02)


def _best(space: SearchSpace) -> Config:
    fits = [c for c in space.configs() if _peak(c) <= USABLE]
    return max(fits, key=lambda c: _probe(c).rate)


def _prediction(space: SearchSpace) -> MemoryPrediction:
    """The estimator's answer: each precision's tensor bytes at two batches (its curve between)."""
    factors = peak_factors("cuda")
    typical = factors["typical_factor"]
    estimates = {Config(batch_size=b, precision=p): b * PER_SAMPLE_BYTES[p] / typical + GiB / typical
                 for p in space.values_of("precision") for b in (8, 2048)}
    return MemoryPrediction.from_estimates(estimates, device_bytes=GiB, **factors)


def _replay(planner: Planner, limit: int = 60) -> list[Observation]:
    seen: list[Observation] = []
    while (config := planner.next(seen)) is not None:
        assert len(seen) < limit, "the planner did not finish"
        seen.append(_probe(config))
    return seen


@pytest.mark.parametrize("predicted", [False, True], ids=["memory-line", "estimator"])
def test_the_pilot_climbs_to_its_memory_edge_before_the_other_precisions_which_are_probed_there(predicted):
    """On a device whose memory is known the pilot starts at a memory-scaled guess (70 GiB: b=32, not 4), or
    with the estimator's prediction (a GPU's, believed before any probe) at the largest batch it predicts to
    fit, and the expected best precision climbs to its memory edge before the others are swept, each once at
    the batch it reached."""
    space = _space()
    planner = Planner(space, USABLE, check_noise=False, prediction=_prediction(space) if predicted else None)
    seen = _replay(planner)
    pilot = seen[0].config
    assert (pilot.precision, pilot.batch_size) == ("bf16", 1536 if predicted else 32)
    first_other = next(i for i, o in enumerate(seen) if o.config.precision != "bf16")
    climb = seen[:first_other]
    assert all(o.status == "ok" for o in climb)  # no blind leap into an OOM
    edge = max(o.config.batch_size for o in climb)
    assert edge == 1536  # bf16's largest batch that fits (1,933 samples of it would), before any other precision
    # Then each other precision once, at the batch the pilot's strategy reached (or below, where the memory
    # models or the estimator say that one does not fit it): where they compare.
    firsts = {}
    for o in seen[first_other:]:
        if o.config.precision != "bf16":
            firsts.setdefault(o.config.precision, o.config.batch_size)
    assert set(firsts) == {"fp32", "tf32", "fp16"} and max(firsts.values()) == edge
    assert all(batch >= 1024 for batch in firsts.values())
    assert planner.best(seen) == _best(space) == Config(batch_size=1536, precision="bf16")


def test_on_a_small_memory_the_pilot_stays_at_its_smallest_guess():
    planner = Planner(_space(), 2 * GiB, check_noise=False)
    assert planner.next([]) == Config(batch_size=4, precision="bf16")


def test_with_the_pilot_running_out_of_memory_the_precisions_are_compared_at_once():
    space = _space()
    planner = Planner(space, USABLE, check_noise=False)
    seen = [Observation(Config(batch_size=4, precision="bf16"), "oom")]
    assert planner.next(seen).precision != "bf16"


def test_with_the_pilot_at_the_top_of_the_space_the_precisions_are_compared_at_its_batch():
    planner = Planner(_space((1, 4)), USABLE, check_noise=False)
    seen = [_probe(Config(batch_size=4, precision="bf16"))]
    assert planner.next(seen) == Config(batch_size=4, precision="fp32")


def test_when_the_data_ends_the_climb_the_precisions_are_compared_at_the_pilots_batch():
    """Every batch above the pilot's ran out of data: the climb is over, and the sweep comes next."""
    planner = Planner(_space((4, 64)), USABLE, check_noise=False)
    seen = [_probe(Config(batch_size=4, precision="bf16"))]
    while (config := planner.next(seen)).precision == "bf16":
        assert config.batch_size > 4 and len(seen) < 6
        seen.append(Observation(config, "error", data_bound=True))
    assert len(seen) > 1 and config == Config(batch_size=4, precision="fp32")


def test_while_the_climb_runs_another_worker_compares_a_precision_instead_of_climbing_twice():
    planner = Planner(_space(), USABLE, check_noise=False)
    seen = [_probe(Config(batch_size=4, precision="bf16"))]
    climb = planner.next(seen)
    seen.append(Observation(climb, "running"))
    assert planner.next(seen) == Config(batch_size=4, precision="fp32")
