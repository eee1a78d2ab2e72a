"""autofit.forecast's pure logic: the memory fit, the throughput model, precisions, prices and budgets.
The error figures themselves come from benchmarks/forecast.py (docs/benchmarks.md), held here too."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from autofit.errors import UsageError
from autofit.forecast import (
    CONTEXT_BYTES,
    GPUS,
    Measured,
    MemoryLine,
    forecast,
    forecast_input,
    gpu_spec,
    largest_fit,
    scale_rate,
    spec_of_device,
    usable_bytes,
)
from autofit.study import bundled_storage_url
from benchmarks.forecast import held_out, memory_rows, throughput_rows
from tests.support import REPO

GIB = 1024**3
FILE = os.path.join(REPO, "benchmarks", "gpu", "results", "2026-11-25-gpt124m.best.json")


def _document(**measured) -> dict:
    return json.load(open(FILE)) | ({"measured": {**json.load(open(FILE))["measured"], **measured}} if measured else {})


def test_the_largest_fit_stays_inside_the_usable_memory_and_divides_the_global_batch():
    line = MemoryLine.through({16: 24.62 * GIB, 32: 47.81 * GIB, 48: 71.00 * GIB})
    assert line.slope == pytest.approx((71.00 - 47.81) / 16 * GIB)  # the steepest neighbours' slope
    assert all(line.peak(b) >= p for b, p in {16: 24.62 * GIB, 32: 47.81 * GIB, 48: 71.00 * GIB}.items())
    usable = usable_bytes(24 * 1000**3, 0.1)
    batch = largest_fit(line, usable, 48)
    assert 48 % batch == 0 and line.peak(batch) <= usable < line.peak(batch + 1) + line.slope * 4
    assert largest_fit(line, usable, None) >= batch  # without a global batch: not held to its divisors
    assert largest_fit(line, 1 * GIB, 48) == 0  # not even one sample: 0, never a rounded-up fit


def test_one_peak_grows_wholly_above_its_micro_batch_and_does_not_shrink_below_it():
    line = MemoryLine.through({48: 48 * GIB})
    assert line.peak(96) == 96 * GIB and line.peak(12) == 48 * GIB
    assert "none to shrink below" in line.basis


def test_one_peak_of_a_model_with_a_large_fixed_part_never_fits_a_gpu_the_fixed_part_does_not():
    """40 GiB of weights and optimizer state, 0.5 GiB a sample, measured once at b=64 (72 GiB): on a 24 GB
    GPU nothing fits; scaling the peak down in proportion (1.125 GiB a sample) would say b=16."""
    line = MemoryLine.through({64: (40 + 0.5 * 64) * GIB})
    assert largest_fit(line, usable_bytes(GPUS["L4"].memory_bytes, 0.1), 480) == 0
    answer = forecast(_document() | {"runner_ups": [], "config": {**_document()["config"], "global_batch": 48}},
                      [gpu_spec("L4")])
    assert answer.targets[0].config is None  # GPT-2 small's one peak, 71 GiB at b=48: not scaled down to fit 24 GB
    assert any("no measured strategy fits" in note for note in answer.targets[0].notes)


def test_one_peak_with_the_estimators_slopes_bounds_the_study_s_other_peaks():
    measured = forecast_input("gpt", bundled_storage_url())
    bf16 = {r["batch_size"]: r["peak_bytes"] for r in measured.rows if r["precision"] == "bf16"}
    winner = measured.best.config.batch_size
    low, high = measured.per_sample[next(k for k in measured.per_sample if dict(k)["precision"] == "bf16")]
    assert 0 < low < high
    line = MemoryLine.through({winner: measured.best.measured.peak_bytes}, (low, high))
    assert "estimator" in line.basis
    assert all(line.peak(b) >= peak for b, peak in bf16.items())  # above and below the one point
    alone = Measured(replace(measured.best, runner_ups=()), per_sample=measured.per_sample)
    fits = {f.label: f for f in forecast(alone, [gpu_spec("L4")]).targets[0].fits}
    assert "estimator" in fits["bf16"].memory_basis


def test_the_usable_memory_keeps_the_headroom_and_the_cuda_context():
    assert usable_bytes(80 * GIB, 0.1) == pytest.approx(72 * GIB - CONTEXT_BYTES)


def test_the_gpu_a_file_was_measured_on_is_found_by_its_nvml_name_and_memory():
    assert spec_of_device("NVIDIA H100 80GB HBM3", 85520809984).name == "H100"
    assert spec_of_device("NVIDIA A100-SXM4-40GB", 40960 * 1024**2).name == "A100-40GB"
    assert spec_of_device("NVIDIA H100 PCIe").name == "H100-PCIe"
    assert spec_of_device("NVIDIA GH200 480GB") is None and spec_of_device("AMD EPYC (2 cores)") is None
    with pytest.raises(UsageError, match="must be one of"):
        gpu_spec("H1000")


def test_on_the_gpu_it_was_measured_on_the_forecast_is_the_measurement():
    h100 = GPUS["H100"]
    rate = scale_rate(136.7, 894e9, "bf16", h100, h100, "bf16")
    assert rate.samples_per_s == pytest.approx(136.7) and rate.low < 136.7 < rate.high


def test_the_split_lies_between_the_single_ratios_and_the_interval_widens_without_flops():
    a100, h100 = GPUS["A100-80GB"], GPUS["H100"]
    with_flops = scale_rate(231e3 / 1024, 894e9, "bf16", a100, h100, "bf16")
    without = scale_rate(231e3 / 1024, None, "bf16", a100, h100, "bf16")
    ratio = with_flops.samples_per_s / (231e3 / 1024)
    assert h100.bandwidth / a100.bandwidth < ratio < h100.matmul("bf16") / a100.matmul("bf16")
    assert (with_flops.basis, without.basis) == ("mfu", "no-flops")
    assert without.high / without.low > with_flops.high / with_flops.low


def test_a_profile_scales_each_kernel_class_by_its_own_bound():
    a100, h100 = GPUS["A100-80GB"], GPUS["H100"]
    all_matmul = scale_rate(100.0, None, "bf16", a100, h100, "bf16", profile={"matmul": 1.0})
    all_memory = scale_rate(100.0, None, "bf16", a100, h100, "bf16", profile={"elementwise": 1.0})
    assert all_matmul.samples_per_s == pytest.approx(100.0 * h100.matmul("bf16") / a100.matmul("bf16"))
    assert all_memory.samples_per_s == pytest.approx(100.0 * h100.bandwidth / a100.bandwidth)
    assert all_matmul.basis == "profile"


def test_a_gpu_without_bf16_runs_fp16_and_says_so():
    answer = forecast(_document(), [gpu_spec("T4")])
    target = answer.targets[0]
    assert target.config["precision"] == "fp16" and target.chosen.precision == "fp16"
    assert any("no bf16" in note for note in target.notes)


def test_a_cpu_study_forecasts_memory_and_only_a_labelled_wide_rate():
    document = _document() | {"device": {"type": "cpu", "name": "AMD EPYC", "total_bytes": 25 * GIB}}
    answer = forecast(document, [gpu_spec("H100")])
    assert answer.targets[0].chosen.rate.basis == "flops-only"
    assert any("not a measurement" in note for note in answer.notes)


def test_a_budget_and_prices_give_hours_and_dollars_and_bad_ones_are_refused():
    answer = forecast(_document(), [gpu_spec("H100"), gpu_spec("T4")], prices={"h100": 2.0}, tokens=10e9)
    h100 = answer.targets[0]
    tokens_per_s = h100.chosen.rate.samples_per_s * 1024
    assert answer.hours(h100)[0] == pytest.approx(10e9 / tokens_per_s / 3600)
    assert answer.cost(h100, 1e9)[0] == pytest.approx(2.0 * 1e9 / tokens_per_s / 3600)
    assert answer.cost(answer.targets[1], 1e9) is None  # no T4 price in the table
    with pytest.raises(UsageError, match="must name a target GPU"):
        forecast(_document(), [gpu_spec("H100")], prices={"L4": 0.5})
    with pytest.raises(UsageError, match="give one"):
        forecast(_document(), [gpu_spec("H100")], tokens=1e9, samples=1e6)
    samples_only = _document(tokens_per_s=None)
    with pytest.raises(UsageError, match="give --samples"):
        forecast(samples_only, [gpu_spec("H100")], tokens=1e9)


def test_the_published_pairs_are_within_ten_percent_and_inside_their_interval():
    rows = throughput_rows()
    assert sorted(abs(r["error"]) for r in rows)[len(rows) // 2] <= 0.10
    assert all(r["low"] <= r["measured_target"] <= r["high"] for r in rows)
    assert all(abs(r["error"]) < min(abs(r["peak_error"]), abs(r["matmul_error"])) for r in rows)


def test_no_memory_forecast_of_the_h100_logs_would_have_run_out_of_memory():
    rows = memory_rows()
    assert rows and not any(r["oom"] for r in rows)
    assert any(r["measured_peak"] is not None and r["gpu"] != "H100" for r in rows)


def test_the_held_out_check_reads_a_file_and_states_its_error(tmp_path):
    path = tmp_path / "h100.best.json"
    path.write_text(open(FILE).read())
    result = held_out(str(path), "H100", measured_samples=136.69419195175772, measured_tokens=139974.85)
    assert result["config"]["batch_size"] == 48 and abs(result["error"]) < 1e-6 and result["passes"]
    assert abs(result["tokens_error"]) < 1e-6


def test_the_config_to_run_is_the_chosen_strategys_own_not_the_winners_knobs():
    """The winner compiled and does not fit an L4; the eager fp32 runner-up does: the L4 config is eager."""
    document = _document()
    winner = {**document["config"], "compile": True}
    runner = {"batch_size": 4, "accumulation_steps": 12, "global_batch": 48, "precision": "fp32",
              "checkpoint_segments": 0, "samples_per_s": 40.0, "peak_bytes": 9.19 * GIB}
    answer = forecast(document | {"config": winner, "runner_ups": [runner]}, [gpu_spec("L4")])
    target = answer.targets[0]
    assert target.chosen.label == "fp32" and target.config["precision"] == "fp32"
    assert "compile" not in target.config and target.config["batch_size"] * target.config["accumulation_steps"] == 48
    assert {f.label for f in target.fits} == {"bf16 compiled", "fp32"}


def test_by_tokens_the_measured_token_cap_is_kept_where_its_peak_fits():
    document = _document()
    by_tokens = {**document, "config": {**document["config"], "max_tokens": 8192, "global_batch": None},
                 "runner_ups": []}
    answer = forecast(by_tokens, [gpu_spec("H200"), gpu_spec("L4")])
    h200, l4 = answer.targets
    assert h200.config["batch_size"] == 48 and h200.config["max_tokens"] == 8192  # not scaled up by samples
    assert "by tokens" in h200.chosen.memory_basis
    assert l4.config is None  # 71 GiB measured: not on a 24 GB GPU
