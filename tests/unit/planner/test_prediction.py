"""The planner with the memory estimator's predictions: what it skips, where it starts, how often it
runs out of memory on the recorded landscapes, and a real search whose estimator dies."""

import json
import statistics

import pytest

from autofit.config import Config
from autofit.memory import peak_factors
from autofit.planner import MemoryPrediction, Observation, Planner, SearchSpace, configs_to_estimate
from benchmarks.landscape import Landscape, landscape_paths
from benchmarks.strategies import run_strategy
from tests.support import autofit_cli, script

MIB = 2**20
BATCHES = (8, 12, 16, 24, 32, 48, 64, 96, 128)
USABLE = 400 * MIB


def _tensor(config: Config) -> float:
    return config.batch_size * 2 * MIB  # what the estimator counts


def _true_peak(config: Config) -> float:
    """The device's peak: a baseline, and 2.2 bytes per counted byte (allocator, workspaces)."""
    return 200 * MIB + 2.2 * _tensor(config)  # fits up to b=45: the largest fit is 32


def _probe(config: Config) -> Observation:
    peak = _true_peak(config)
    status = "ok" if peak <= 512 * MIB else "oom"
    return Observation(config, status, int(peak) if status == "ok" else None,
                       rate=100 * config.batch_size / (config.batch_size + 8), wall_s=1.0)


def _search(prediction):
    space = SearchSpace(BATCHES)
    planner = Planner(space, USABLE, check_noise=False, prediction=prediction)
    seen = []
    while (config := planner.next(seen)) is not None:
        seen.append(_probe(config))
    return planner, seen


def test_interpolated_estimates_and_a_range_between_two_measured_batches():
    prediction = MemoryPrediction.from_estimates({Config(batch_size=8): 10.0, Config(batch_size=32): 40.0}, device_bytes=5.0,
                                                 **peak_factors("cpu"))
    assert prediction.tensor_bytes(Config(batch_size=16)) == pytest.approx(20.0)
    assert prediction.tensor_bytes(Config(batch_size=64)) == pytest.approx(80.0)  # the last two batches' slope
    assert prediction.tensor_bytes(Config(batch_size=16, precision="bf16")) is None  # no estimate of that curve
    before = prediction.calibrate([]).peak(Config(batch_size=16))
    assert before.low == pytest.approx(5.0 + 20.0) and before.high == float("inf")  # no probe: a floor only
    calibrated = prediction.calibrate([Observation(Config(batch_size=8), "ok", 100), Observation(Config(batch_size=32), "ok", 200)])
    between = calibrated.peak(Config(batch_size=16))
    assert 100 * 0.97 < between.low <= 100 and 200 <= between.high < 200 * 1.03  # monotone in batch
    beyond = calibrated.peak(Config(batch_size=64))
    assert beyond.low > 200 and beyond.high > beyond.low  # a factor range measured from the two


def test_configs_to_estimate_take_a_few_batches_per_curve_unchecked_curves_first():
    space = SearchSpace(tuple(2**i for i in range(21)), {"precision": ("fp32", "bf16"), "checkpoint_segments": (0, 2)})
    asked = configs_to_estimate(space.configs())
    assert len(asked) <= 4 * 6
    assert [c.checkpoint_segments for c in asked] == sorted(c.checkpoint_segments for c in asked)
    assert max(c.batch_size for c in asked) <= 2048  # not the absurd top of the range


def test_the_planner_skips_what_the_prediction_rules_out_and_starts_next_to_the_predicted_fit():
    prediction = MemoryPrediction.from_estimates({Config(batch_size=b): _tensor(Config(batch_size=b)) for b in BATCHES},
                                                 device_bytes=150 * MIB, **peak_factors("cpu"))
    planner, seen = _search(prediction)
    assert all(o.fits(USABLE) for o in seen), [(o.config.batch_size, o.status, o.peak_bytes) for o in seen]
    assert planner.best(seen) == Config(batch_size=32)  # the largest that fits is the fastest here
    assert seen[1].config == Config(batch_size=32)  # after the pilot, straight to the predicted fit
    assert Config(batch_size=48) not in {o.config for o in seen}  # predicted to maybe not fit, for too little gain
    assert planner.predicted_peak(Config(batch_size=48), seen).high > USABLE
    assert planner.predicted_peak(Config(batch_size=64), seen).low > USABLE  # predicted not to fit at all
    blind_planner, blind = _search(None)  # the same landscape from probes alone: the memory line skips b=48 too (its
    # best guess over the usable memory, too little gain for a gamble), but it takes a probe more to get there
    assert blind_planner.best(blind) == Config(batch_size=32) and len(blind) > len(seen)


@pytest.mark.parametrize("path", landscape_paths(), ids=lambda p: p.rsplit("/", 1)[-1])
def test_recorded_landscapes_need_no_oom_probe_in_the_median_with_predictions(path):
    landscape = Landscape.load(path)
    assert landscape.prediction() is not None, "record its estimates: python -m benchmarks.record_estimates"
    runs = [run_strategy("autofit", landscape, seed=seed) for seed in range(10)]
    assert statistics.median(r.oom_probes for r in runs) == 0
    assert statistics.median(r.ratio for r in runs) >= 0.97


@pytest.mark.slow
def test_a_search_whose_estimator_crashes_says_so_and_goes_on(tmp_path):
    out = tmp_path / "best.json"
    done = autofit_cli("search", script("crashes_under_fake_tensors.py"), "--trials", "3",
                       "--budget", "2m", "--memory-limit", "2GiB", "--storage", f"sqlite:///{tmp_path}/s.db",
                       "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "memory estimator: no estimate (the estimator exited with status" in done.stderr
    document = json.loads(out.read_text())
    assert document["config"]["batch_size"] >= 1 and document["measured"]["samples_per_s"] > 0


@pytest.mark.parametrize("path", landscape_paths(), ids=lambda p: p.rsplit("/", 1)[-1])
def test_calibrated_predictions_of_the_bundled_studies_are_within_ten_percent(path):
    """The prediction each probe of a replayed search met, against the peak recorded for real."""
    landscape = Landscape.load(path)
    pairs = [(r, peak) for seed in range(5) for r, peak in run_strategy("autofit", landscape, seed=seed).predictions
             if r.high != float("inf")]
    errors = sorted(abs(r.middle / peak - 1) for r, peak in pairs)
    assert len(pairs) >= 5 and statistics.median(errors) <= 0.10 and errors[-1] <= 0.20, errors
