"""Model FLOPs, FLOP/s, MFU and energy per probe: counted by PyTorch's FlopCounterMode on real steps."""

from __future__ import annotations

import itertools

import pytest

from autofit.config import Config
from autofit.devices import mfu, peak_flops_per_s
from autofit.probing import ProbeResult
from autofit.runtime import Run, StepClock


def test_compiled_configs_count_nothing_and_fsdp_ranks_neither():
    assert Run(Config(batch_size=2, compile=True), probing=True, count_flops=True).control.flops is None
    assert Run(Config(batch_size=2), probing=True, count_flops=True).control.flops is not None
    assert Run(Config(batch_size=2), probing=True).control.flops is None  # a normal run never pays for counting


def test_mfu_is_flops_over_the_dense_peak_of_each_rank():
    result = ProbeResult("ok", Config(batch_size=8, precision="bf16"), samples_per_s=100.0, world_size=2)
    peak = peak_flops_per_s("NVIDIA H100 80GB HBM3", "bf16")
    assert peak == pytest.approx(989.4e12)  # dense, not the datasheet's 1,979 with sparsity
    result.set_flops(2e12, peak)
    assert result.flops_per_s == pytest.approx(2e14)
    assert result.mfu == pytest.approx(2e14 / (2 * 989.4e12))
    assert mfu(1e14, "NVIDIA H100 PCIe", "fp32") == pytest.approx(1e14 / 51e12)
    assert mfu(1e14, "AMD EPYC 9R14", "bf16") is None


def test_the_clock_counts_energy_and_allocator_retries_over_the_measured_steps_only():
    counter = itertools.count(start=1000.0, step=10.0)  # joules, 10 J more at every read
    reads: list[float] = []
    retries = [0]

    def energy() -> float:
        reads.append(next(counter))
        return reads[-1]

    clock = StepClock(warmup_steps=2, measured_steps=3, synchronize=lambda: None,
                      counters={"energy_j": energy, "alloc_retries": lambda: retries[0]})
    clock.start()
    for step in range(5):
        retries[0] += 3 if step < 2 else 1  # the warm-up's retries (cuDNN's first workspaces) are not counted
        clock.step_done(samples=4, tokens=0)
    assert clock.complete and len(reads) == 2  # read at the end of warm-up and at the last step
    assert clock.measured_energy_j == pytest.approx(10.0)
    assert clock.counted["alloc_retries"] == 3


@pytest.mark.slow  # the default tier stays under 5 minutes on 2 cores
def test_a_gpt_probe_counts_what_the_palm_formula_says(tmp_path):
    """The nanoGPT study (benchmarks/gpu/nanogpt.py), shrunk, probed for real through the CLI: its
    counted FLOPs per token are the standard 6N + 12·layers·context·width (PaLM, appendix B; N the
    matmul weights, tied output layer included) within 3%; without attention they would be 11% short."""
    import json
    import os

    from tests.support import REPO, autofit_cli

    layers, width, context, vocab = 2, 64, 64, 512
    env = {"NANOGPT_SEQ": str(context), "NANOGPT_LAYERS": str(layers), "NANOGPT_WIDTH": str(width),
           "NANOGPT_VOCAB": str(vocab), "NANOGPT_TOKENS": "20000"}
    probed = autofit_cli("probe", os.path.join(REPO, "benchmarks", "gpu", "nanogpt.py"), "--device", "cpu",
                         "--memory-limit", "2GiB", "--batch-size", "4", "--json", cwd=tmp_path, env=env)
    result = json.loads(probed.stdout)["result"]
    assert result["status"] == "ok", probed.stderr[-2000:]
    matmul_weights = layers * 12 * width * width + vocab * width
    per_token = 6 * matmul_weights + 12 * layers * context * width
    assert result["flops_per_sample"] / context == pytest.approx(per_token, rel=0.03)
    assert result["flops_per_s"] == pytest.approx(result["samples_per_s"] * result["flops_per_sample"])

