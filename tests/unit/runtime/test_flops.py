"""Model FLOPs, FLOP/s, MFU and energy per probe: counted by PyTorch's FlopCounterMode on real steps."""

from __future__ import annotations

import itertools

import pytest
import torch

from autofit.config import Config
from autofit.devices import make_backend, mfu, peak_flops_per_s
from autofit.probing import ProbeResult
from autofit.probing._probe import run_probe
from autofit.runtime import Run, StepClock

D_IN, D_HIDDEN, D_OUT = 32, 64, 16


def mlp_step_flops() -> int:
    """What one sample of the two-layer MLP below costs, by hand: forward 2·(in·hidden + hidden·out),
    weight gradients the same again, input gradient only for the second layer (the data needs none)."""
    forward = 2 * (D_IN * D_HIDDEN + D_HIDDEN * D_OUT)
    return forward + forward + 2 * D_HIDDEN * D_OUT


def train_mlp(run: Run) -> None:
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList([torch.nn.Linear(D_IN, D_HIDDEN), torch.nn.Linear(D_HIDDEN, D_OUT)])
    run.checkpoint(blocks)
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-3)
    data = (torch.randn(run.batch_size, D_IN) for _ in itertools.count())
    for x in run.batches(data):
        with run.autocast():
            loss = blocks[1](torch.relu(blocks[0](x))).square().mean()
        print(f"loss {loss.item():.3f}")  # a script's .item() logging: counted like any other step
        run.backward(loss, opt, clip_grad_norm=1.0)


def probe(config: Config) -> ProbeResult:
    result = run_probe(train_mlp, config, make_backend("cpu", 0), warmup_steps=1, measured_steps=2, min_measure_s=0)
    assert result.ok, result.error_message
    return result


def test_a_probe_counts_the_model_flops_of_its_first_step():
    result = probe(Config(batch_size=8))
    assert result.flops_per_sample == mlp_step_flops()
    assert result.flops_per_s == pytest.approx(result.samples_per_s * mlp_step_flops())
    assert result.mfu is None  # a CPU has no dense-peak entry: null, never a guess
    assert result.joules_per_sample is None


def test_checkpointing_recompute_is_not_counted_as_model_flops():
    """Both blocks recompute their forward in backward; MFU counts model FLOPs, so the count stays
    that of the plain step (a torch that counted the recompute would add a forward's worth)."""
    assert probe(Config(batch_size=8, checkpoint_segments=2)).flops_per_sample == mlp_step_flops()


def test_compiled_configs_count_nothing_and_fsdp_ranks_neither():
    assert Run(Config(batch_size=2, compile=True), probing=True, count_flops=True).flops is None
    assert Run(Config(batch_size=2), probing=True, count_flops=True).flops is not None
    assert Run(Config(batch_size=2), probing=True).flops is None  # a normal run never pays for counting


def test_cpu_attention_is_counted_like_the_cuda_kernels():
    """PyTorch has no FLOP formula for the CPU's fused attention kernel; autofit gives it the CUDA one."""
    from torch.utils.flop_counter import FlopCounterMode

    from autofit.runtime._flops import _count_cpu_attention

    _count_cpu_attention()
    q = torch.randn(2, 4, 64, 16, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().backward()
    forward = 2 * 2 * 4 * 64 * 64 * 16 * 2  # two batched matmuls of (64x16)(16x64) per head
    assert counter.get_total_flops() >= forward * 3  # forward, and a backward about twice it


def test_mfu_is_flops_over_the_dense_peak_of_each_rank():
    result = ProbeResult("ok", Config(batch_size=8, precision="bf16"), samples_per_s=100.0, world_size=2)
    peak = peak_flops_per_s("NVIDIA H100 80GB HBM3", "bf16")
    assert peak == pytest.approx(989.4e12)  # dense, not the datasheet's 1,979 with sparsity
    result.set_flops(2e12, peak)
    assert result.flops_per_s == pytest.approx(2e14)
    assert result.mfu == pytest.approx(2e14 / (2 * 989.4e12))
    assert mfu(1e14, "NVIDIA H100 PCIe", "fp32") == pytest.approx(1e14 / 51e12)
    assert mfu(1e14, "AMD EPYC 9R14", "bf16") is None


def test_the_clock_measures_energy_over_the_measured_steps_only():
    counter = itertools.count(start=1000.0, step=10.0)  # joules, 10 J more at every read
    reads: list[float] = []

    def energy() -> float:
        reads.append(next(counter))
        return reads[-1]

    clock = StepClock(warmup_steps=2, measured_steps=3, synchronize=lambda: None, energy=energy)
    clock.start()
    for _ in range(5):
        clock.step_done(samples=4, tokens=0)
    assert clock.complete and len(reads) == 2  # read at the end of warm-up and at the last step
    assert clock.measured_energy_j == pytest.approx(10.0)


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

