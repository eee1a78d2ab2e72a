"""The climb to the memory edge where the device is launch-bound (a micro-batch costs about the same whatever
its size): while the measured peak is far below the usable memory and throughput still rises, each step at
least doubles, whatever the prediction's high end says; near the edge it slows by the measured memory; a
function that batches by tokens starts its climb from a cap sized by its pilot's memory (issue 43: an H200
search under a 2 GiB cap spent its 60 s on a by-samples pilot, then max_tokens 1024 and 1536, and exported a
cap at a quarter of a fixed batch's speed)."""

from __future__ import annotations

import pytest

from autofit.config import Config
from autofit.memory import peak_factors
from autofit.planner import MemoryPrediction, Observation, Planner, SearchSpace

GiB, MiB = 2**30, 2**20
SPACE = SearchSpace.build(batch_range=(1, 4096), precision=("fp32",))


def _launch_bound(config: Config, intercept: float, per_sample: float, usable: float) -> Observation:
    """Peak = intercept + per_sample x size; a step's time mostly a fixed 5 ms, so throughput rises with size."""
    peak = intercept + per_sample * config.size
    if peak > usable:
        return Observation(config, "oom", wall_s=1.0)
    return Observation(config, "ok", peak_bytes=int(peak), rate=config.size / (5e-3 + config.size * 1e-6),
                       wall_s=1.0, spread=0.02)


def _estimated(intercept: float, per_sample: float, times: float) -> MemoryPrediction:
    """The estimator's answer at a GPU's factor range, `times` the real memory per sample (over 1: fake tensors
    on the CPU run math attention where the GPU runs a fused kernel, and until two probes calibrate it, its
    high end blocks the climb)."""
    factors = peak_factors("cuda")
    estimates = {Config(batch_size=b): (intercept + times * per_sample * b) / factors["typical_factor"]
                 for b in (8, 64, 512)}
    return MemoryPrediction.from_estimates(estimates, device_bytes=0, **factors)


def test_far_below_the_memory_edge_a_rising_climb_doubles_whatever_the_predictions_high_end():
    """Each step from a fit whose peak is at most half the usable memory at least doubles (its high end, at
    100x the real memory a sample, allowed 12 after the pilot's 8), and no probe runs out of memory."""
    usable, intercept, per_sample = 16 * GiB, 3 * GiB, 16 * MiB
    planner = Planner(SPACE, usable, check_noise=False, prediction=_estimated(intercept, per_sample, 100))
    seen: list[Observation] = []
    while (config := planner.next(seen)) is not None and len(seen) < 20:
        seen.append(_launch_bound(config, intercept, per_sample, usable))
    ends = next((i for i in range(1, len(seen)) if seen[i].config.size < seen[i - 1].config.size), len(seen))
    climb = seen[:ends]  # then the neighbours of the best
    assert all(o.status == "ok" for o in seen)
    far = [(a.config.size, b.config.size) for a, b in zip(climb, climb[1:]) if a.peak_bytes <= usable / 2]
    assert far and all(b >= 2 * a for a, b in far), [o.config.size for o in seen]
    assert max(o.config.size for o in climb) == 768  # the edge: 816 samples would fit


def test_near_the_memory_edge_the_step_follows_the_measured_peak():
    """At 70% of the usable memory the step is what the measured peak allows (2048: usable x 1536 / peak, a
    certain fit), not a doubling; the prediction's high end (its prior range) would have stopped the climb."""
    usable, per_sample = 16 * GiB, 0.7 * 16 * GiB / 1536
    prediction = _estimated(0, per_sample, 1)
    planner = Planner(SPACE, usable, check_noise=False, prediction=prediction)
    seen = [_launch_bound(Config(batch_size=1536), 0, per_sample, usable)]
    step = planner.next(seen)
    assert step is not None and step.batch_size == 2048


#: The H200 search of issue 43, by tokens: a small causal LM, its longest sample 1024 tokens, 1.80 GiB usable,
#: a large fixed part (weights, optimizer, the allocator's) and some 64 KiB a padded token.
LONGEST, USABLE_TOKENS = 1024, 1843 * MiB
FIXED, PER_TOKEN = 870 * MiB, 64 * 2**10


def _token_space(precisions: tuple[str, ...]) -> SearchSpace:
    return SearchSpace.build(batch_range=(1, 2**20), token_range=(LONGEST, 2**20), precision=precisions,
                             longest_sample=LONGEST)


def _token_probe(config: Config, tokens: int) -> Observation:
    """A cap's worst batch holds `tokens` padded tokens (a by-samples pilot's: b of the longest samples)."""
    peak = FIXED + PER_TOKEN * tokens
    if peak > USABLE_TOKENS:
        return Observation(config, "oom", wall_s=1.0)
    return Observation(config, "ok", peak_bytes=int(peak), rate=tokens / (5e-3 + tokens * 1e-7), wall_s=1.0,
                       spread=0.02)


def _token_prediction(space: SearchSpace) -> MemoryPrediction:
    """The estimator's answer over the caps (their tensors: a padded token's), at a CPU's factor range."""
    factors = peak_factors("cpu")
    estimates = {space.config(s, cap): PER_TOKEN * cap / factors["typical_factor"]
                 for s in space.strategies() for cap in (1024, 8192, 65536)}
    return MemoryPrediction.from_estimates(estimates, device_bytes=FIXED, **factors)


@pytest.mark.parametrize("precisions", [("fp32",), ("bf16", "fp32")], ids=["one-precision", "precisions"])
@pytest.mark.parametrize("predicted", [False, True], ids=["memory-line", "estimator"])
def test_a_token_functions_first_cap_is_sized_from_its_pilots_memory(precisions, predicted):
    """The pilot by samples (b=4: 4 of the longest samples, a cap of 4096 tokens' worst batch) fit at 1.13 GiB:
    the first cap probed is the largest that memory allows from it (usable x 4096 / peak: 6144; the estimator,
    calibrated on it, allows 8192), not the smallest (1024); the climb then follows the line through both
    peaks: two caps probed after the pilot, both fit, and the second is within 1.5x of the edge (before: 1024,
    then 1536)."""
    space = _token_space(precisions)
    prediction = _token_prediction(space) if predicted else None
    planner = Planner(space, USABLE_TOKENS, check_noise=False, prediction=prediction)
    pilot = Config(batch_size=4, precision=precisions[0])
    seen = [_token_probe(pilot, 4 * LONGEST)]
    first = planner.next(seen)
    assert first is not None and first.max_tokens == (8192 if predicted else 6144)
    assert first.precision == precisions[0]
    while len(seen) < 3 and (config := planner.next(seen)) is not None:
        seen.append(_token_probe(config, config.max_tokens))
    edge = (USABLE_TOKENS - FIXED) / PER_TOKEN  # 15,568 tokens
    assert all(o.status == "ok" and o.config.precision == precisions[0] for o in seen)
    assert planner.best(seen).max_tokens * 1.5 >= edge, [o.config.label() for o in seen]


def test_a_pilot_out_of_memory_rules_out_its_cap_and_those_above():
    space = _token_space(("fp32",))
    planner = Planner(space, 2 * GiB, check_noise=False)
    seen = [Observation(Config(batch_size=4), "oom")]
    first = planner.next(seen)
    assert first is not None and first.max_tokens < 4 * LONGEST


def test_while_the_first_cap_runs_another_worker_compares_a_precision_instead_of_climbing_twice():
    space = _token_space(("bf16", "fp32"))
    planner = Planner(space, USABLE_TOKENS, check_noise=False)
    seen = [_token_probe(Config(batch_size=4, precision="bf16"), 4 * LONGEST)]
    first = planner.next(seen)
    seen.append(Observation(first, "running"))
    assert planner.next(seen).precision == "fp32"
