"""Trust, round five (issue 52, item 8): the intervals come from measured pairs once there are enough, and the
error table holds measured pairs only (autofit.forecast's HELD_OUT; benchmarks/forecast.py's table)."""

from __future__ import annotations

import os

import pytest

from autofit.forecast import HELD_OUT, MARGIN, MIN_PAIRS, HeldOutPair, gpu_spec, interval_margin, scale_rate
from benchmarks.forecast import GPT2_FLOPS_PER_SAMPLE, RESULTS, markdown, memory_rows, throughput_rows


def _pairs(*errors: float) -> list[HeldOutPair]:
    return [HeldOutPair(program="nanoGPT defaults", source="H200", target="H100", basis="mfu", forecast=1000 * (1 + e),
                        measured=1000.0, date="2026-12-04", log="2026-12-04-nanogpt-h200.log") for e in errors]


def test_the_margin_is_fixed_until_enough_held_out_pairs_measure_it():
    few = _pairs(-0.017, 0.008, 0.03, -0.05)
    assert len(few) < MIN_PAIRS and interval_margin("mfu", few)[0] == MARGIN["mfu"]
    assert "fixed until 5 held-out pairs measure it (4 so far)" in interval_margin("mfu", few)[1]
    enough = _pairs(-0.017, 0.008, 0.03, -0.05, 0.12)
    assert interval_margin("mfu", enough) == (pytest.approx(1.12), "the largest error of 5 held-out pairs")
    assert interval_margin("no-flops", enough)[0] == MARGIN["no-flops"]  # pairs of another basis measure nothing
    args = (400.0, GPT2_FLOPS_PER_SAMPLE, "bf16", gpu_spec("H200"), gpu_spec("H100"), "bf16")
    fixed, measured = scale_rate(*args, pairs=few), scale_rate(*args, pairs=enough)
    assert measured.samples_per_s == fixed.samples_per_s  # the point is the model's; the interval is measured
    assert measured.high / fixed.high == pytest.approx(1.12 / 1.10) and measured.low / fixed.low == pytest.approx(1.10 / 1.12)
    assert "held-out pairs" in measured.margin_from


def test_every_held_out_pair_has_its_log_and_the_table_holds_measured_pairs_only():
    """Each pair the package counts names a log the repository keeps; the error table's rows are measured on
    both GPUs (the public pair, marked as the one the model was shaped on, and the held-out ones), never a
    forecast nothing measured."""
    for pair in HELD_OUT:
        assert os.path.exists(os.path.join(RESULTS, pair.log)), pair
    rows = throughput_rows(_pairs(-0.017, 0.008))
    assert all(r["measured_target"] for r in rows)
    assert [r["held_out"] for r in rows] == [False, False, True, True]
    table = markdown(rows, memory_rows())
    assert "| nanoGPT defaults | H200 -> H100 | yes |" in table and "no: it shaped the model" in table
    assert "over 4 measured pairs (2 held out)" in table
