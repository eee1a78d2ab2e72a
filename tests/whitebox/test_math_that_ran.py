"""MFU from the math that ran (issue "Priced for the GPU", item 7): nanoGPT turns TF32 on itself, so its fp32
probes ran TF32 matmuls; measured against fp32's peak they read an MFU of 611.6% on an H100. White-box: the
space a search builds for a function whose probes said so (autofit.search._build_space), and a probe record's
MFU against a peak it cannot have been measured against."""

from __future__ import annotations

import pytest

from autofit.config import Config
from autofit.probing import ProbeResult, WorkerInfo


def _space(knobs: dict):
    from autofit.search import SearchSettings
    from autofit.knobs import Offers
    from autofit.search._build_space import build_space, search_options

    info = WorkerInfo(function="train", options=None, device={"type": "cuda"},
                      precisions=["fp32", "tf32", "bf16", "fp16"], default_precisions=["bf16", "fp32", "tf32", "fp16"],
                      baseline_bytes=0, memory_limit=None, versions={}, load_s=0.0, pid=0)
    settings = SearchSettings(script="train.py", device="cuda")
    return build_space(settings, search_options(info, settings), info, Offers.from_dict(knobs))


def test_a_function_that_forces_tf32_gets_one_strategy_for_fp32_and_tf32():
    plain = _space({"batches": True, "autocast": True})
    assert {"fp32", "tf32"} <= set(plain.values_of("precision"))
    forced = _space({"batches": True, "autocast": True, "forces_tf32": True})
    assert "tf32" in forced.values_of("precision") and "fp32" not in forced.values_of("precision")


def test_an_mfu_over_100_percent_is_said_and_never_stored():
    h100_fp32 = 67e12
    result = ProbeResult(status="ok", config=Config(batch_size=16), samples_per_s=459.0)
    result.set_flops(894e9, h100_fp32)  # 410 TFLOP/s against fp32's 67: TF32 ran
    assert result.mfu is None and result.flops_per_s == pytest.approx(459.0 * 894e9)
    assert any("over 100%" in note and "not stored" in note for note in result.notes)
    sane = ProbeResult(status="ok", config=Config(batch_size=16), samples_per_s=459.0)
    sane.set_flops(894e9, 494.7e12)  # TF32's peak
    assert sane.mfu == pytest.approx(459.0 * 894e9 / 494.7e12) and not sane.notes
