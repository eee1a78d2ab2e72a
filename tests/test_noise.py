"""Noticing interference: suspect measurements are probed again before they win or prune."""
from __future__ import annotations

import pytest

from autofit.config import Config
from autofit.planner._noise import NoiseReading
from autofit.planner._observation import Observation
from autofit.planner._planner import Planner
from autofit.planner._space import SearchSpace
from benchmarks.landscape import synthetic
from benchmarks.strategies import run_strategy

SPACE = SearchSpace.build(batch_size=(8, 64), precisions=("fp32", "bf16"))
GiB = 2**30


def ok(batch: int, rate: float, precision: str = "fp32", spread: float = 0.03, phase: str = "explore") -> Observation:
    return Observation(Config(batch, precision), "ok", peak_bytes=batch * 2**20, samples_per_s=rate,
                       wall_s=1.0, phase=phase, spread=spread)


def reading(observations):
    return NoiseReading(observations, SPACE.strategy_of)


def test_an_erratic_probe_is_suspect():
    noise = reading([ok(8, 100), ok(16, 180), ok(32, 300, spread=0.6)])
    assert set(noise.unresolved()) == {Config(32)}
    assert "varied 60%" in noise.unresolved()[Config(32)].reason


def test_a_dip_below_both_neighbours_is_suspect_and_a_smooth_curve_is_not():
    assert reading([ok(8, 100), ok(16, 180), ok(32, 300)]).unresolved() == {}
    noise = reading([ok(8, 100), ok(16, 60), ok(32, 300)])
    assert set(noise.unresolved()) == {Config(16)}
    assert "slower than its neighbours" in noise.unresolved()[Config(16)].reason


def test_disagreeing_repeats_need_a_third_probe_and_agreeing_ones_do_not():
    assert reading([ok(8, 100), ok(8, 104)]).unresolved() == {}
    assert set(reading([ok(8, 100), ok(8, 40)]).unresolved()) == {Config(8)}
    assert reading([ok(8, 100), ok(8, 40), ok(8, 98)]).unresolved() == {}  # the median decides


def test_a_suspect_cannot_win_until_rechecked():
    planner = Planner(SPACE, 10 * GiB)
    seen = [ok(8, 100), ok(16, 180), ok(32, 900, spread=0.7)]  # an erratic, too-good figure
    assert planner.best(seen) == Config(16)
    assert planner.recheck(seen) == Config(32)
    rechecked = seen + [ok(32, 880, phase="recheck")]
    assert planner.recheck(rechecked) != Config(32)
    assert planner.best(rechecked) == Config(32)  # two agreeing probes: it may win now


def test_a_planner_that_trusts_everything_never_rechecks():
    planner = Planner(SPACE, 10 * GiB, check_noise=False)
    seen = [ok(8, 100), ok(16, 180), ok(32, 900, spread=0.7)]
    assert planner.recheck(seen) is None and planner.best(seen) == Config(32)


def test_a_machine_full_of_suspects_is_called_too_noisy():
    seen = [ok(8, 100), ok(8, 30), ok(16, 180, spread=0.5), ok(32, 40), ok(48, 300), ok(64, 90), ok(64, 300)]
    summary = reading(seen).summary()
    assert summary and "too noisy" in summary
    assert reading([ok(8, 100), ok(16, 180), ok(32, 300)]).summary() is None


def _landscape():
    def rate(c: Config) -> float:  # bf16 is 1.5x faster; throughput saturates with batch
        return (1.5 if c.precision == "bf16" else 1.0) * 1000 * c.batch_size / (c.batch_size + 16)

    return synthetic("noise", SPACE, 10 * GiB, 0.1, peak=lambda c: (1 + c.batch_size / 64) * GiB,
                     rate=rate, sigma=0.02)


@pytest.mark.parametrize("seed", range(6))
def test_under_injected_interference_rechecking_finds_the_best_more_often(seed):
    """A replay where a quarter of probes are slowed 1.5-4x (half of them erratically)."""
    landscape = _landscape()
    with_recheck = run_strategy("autofit", landscape, seed=seed, noise_model="interference")
    without = run_strategy("autofit-no-recheck", landscape, seed=seed, noise_model="interference")
    assert with_recheck.ratio >= without.ratio
    assert with_recheck.ratio >= 0.9


def test_a_config_that_only_just_fits_loses_a_near_tie():
    """Allocator retries (CUDA num_alloc_retries) mark a config at the edge of memory."""
    planner = Planner(SPACE, 10 * GiB, check_noise=False)
    tight = Observation(Config(32), "ok", peak_bytes=3 * GiB, samples_per_s=301, tight=True)
    roomy = Observation(Config(24), "ok", peak_bytes=4 * GiB, samples_per_s=299)
    assert planner.best([tight, roomy]) == Config(24)
    assert planner.best([tight, Observation(Config(24), "ok", peak_bytes=2 * GiB, samples_per_s=250)]) == Config(32)
