"""A probe run in this process (autofit.probing._probe.run_probe, what a probe's child runs): how many steps it
measures, and the FLOPs it counts (autofit.runtime._flops)."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

from autofit.config import Config
from autofit.devices import make_backend
from autofit.probing import ProbeResult
from autofit.probing._probe import run_probe
from autofit.runtime import Run, recovery_enabled
from tests.support.clock import FakeClock
from tests.support.runs import accumulates_to_64


def test_a_loop_that_ends_after_enough_steps_is_measured_as_it_ran():
    """A confirmation asks for 10x a probe's steps; a script whose own loop ends sooner (its data, its
    max_train_steps) is measured as it ran, with a note; one that ends before a probe's few steps is
    still an error that says how to loop."""

    def sixteen_steps(run: Run) -> None:
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in run.batches([torch.randn(run.batch_size, 4) for _ in range(16)]):
            run.backward(model(x).square().mean(), opt)

    backend = make_backend("cpu", 0)
    long = run_probe(sixteen_steps, Config(batch_size=2), backend, warmup_steps=2, measured_steps=50, min_measure_s=0)
    assert long.ok and long.measured_steps == 14 and "returned after 16 optimizer steps" in long.notes[-1]
    short = run_probe(sixteen_steps, Config(batch_size=2), backend, warmup_steps=12, measured_steps=5, min_measure_s=0)
    assert short.status == "error" and short.error_type == "ProbeTooShort"
    assert "its loop over run.batches() ran out first" in short.error_message


def test_a_kept_loop_that_ends_short_is_told_about_its_own_loop():
    """ProbeTooShort once told every function to "iterate run.batches()", a loop it may keep as its own."""

    def three_steps_of_its_own(run: Run) -> None:
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.randn(run.batch_size, 4)).square().mean().backward()
            opt.step()
            opt.zero_grad()

    short = run_probe(three_steps_of_its_own, Config(batch_size=2), make_backend("cpu", 0), warmup_steps=2,
                      measured_steps=5, min_measure_s=0)
    assert short.error_type == "ProbeTooShort" and "returned after 3 optimizer steps" in short.error_message
    assert "its own loop ended first" in short.error_message and "run.batches" not in short.error_message

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

def _kept_loop(run, *, lr: float = 0.01) -> None:
    """A kept loop (its own optimizer step), at a learning rate that is fine or wild."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    while True:
        model(torch.randn(run.batch_size, 8)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_a_kept_loop_that_diverges_is_diverged_though_it_hands_autofit_no_loss():
    """Issue 37, item 4: a followed loop at lr=1e30 came back `ok`: its loss never reached autofit."""
    result = run_probe(lambda run: _kept_loop(run, lr=1e30), Config(batch_size=4), make_backend("cpu"), measured_steps=4)
    assert result.status == "diverged", result.error_message
    calm = run_probe(lambda run: _kept_loop(run), Config(batch_size=4), make_backend("cpu"), measured_steps=4)
    assert calm.status == "ok"


def _accumulates_to_64(run: Run) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    accumulates_to_64(run, model, torch.optim.SGD(model.parameters(), lr=0.01), width=32)


def test_a_kept_loop_with_its_own_accumulation_has_the_same_flops_per_sample_at_every_micro_batch():
    """Issue 44, item 3: under acc=1, its samples were one micro-batch a step, so its FLOPs per sample (and its
    samples/s) read 16x at b=4 and 4x at b=16 of the truth."""
    small, large = (run_probe(_accumulates_to_64, Config(batch_size=batch), make_backend("cpu"), warmup_steps=1,
                              measured_steps=2, min_measure_s=0) for batch in (4, 16))
    assert small.status == large.status == "ok", (small.error_message, large.error_message)
    assert small.flops_per_sample == pytest.approx(large.flops_per_sample, rel=0.03)
    # a sample: the two matmuls forward, their weights' gradients, the second one's input gradient
    model_flops = 2 * (32 * 64 + 64) * 2 + 2 * 64
    assert small.flops_per_sample == pytest.approx(model_flops, rel=0.05)


def _saves_through_hooks(seen: list[bool]):
    """A function that records, at each forward under run.autocast(), whether its graph saved the activation
    through saved-tensor hooks (a pack and an unpack in Python: a tenth of a host-bound step's time)."""

    def train(run: Run) -> None:
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in run.batches(itertools.repeat(torch.randn(run.batch_size, 4), 12)):
            with run.autocast():
                hidden = model[1](model[0](x))
                loss = model[2](hidden).square().mean()
            seen.append(hidden.grad_fn._raw_saved_self.unpack_hook is not None)  # GELU saved its input
            run.backward(loss, opt)

    return train


@pytest.mark.parametrize("recover", [True, False])
def test_a_probe_saves_its_forwards_tensors_as_its_normal_run_does(monkeypatch, recover):
    """Issue 52, item 4: a normal run that recovers from OOMs saves every tensor of a forward under run.autocast()
    through hooks (autofit.runtime._saved, for the redo), and its probes never did: a host-bound run read ~12%
    slower than its probe. A probe now runs the same hooks wherever its normal run will."""
    monkeypatch.setenv("AUTOFIT_OOM_RECOVERY", "1" if recover else "0")
    in_probe, in_run = [], []
    result = run_probe(_saves_through_hooks(in_probe), Config(batch_size=2), make_backend("cpu", 0), warmup_steps=1,
                       measured_steps=2, min_measure_s=0)
    assert result.ok, result.error_message
    run = Run(Config(batch_size=2), "cpu", recover_oom=recovery_enabled())  # as the decorator builds it
    with run.control.active():
        _saves_through_hooks(in_run)(run)
    assert set(in_run) == {recover} and set(in_probe) == {recover}


def _steps_of(seconds: float, slow: set[int]):
    """A loop whose i-th step sleeps `seconds` (twice that for i in `slow`), on the test's fake clock."""

    def train(run: Run) -> None:
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i, x in enumerate(run.batches(itertools.repeat(torch.randn(run.batch_size, 4)))):
            time.sleep(seconds * (2 if i in slow else 1))
            run.backward(model(x).square().mean(), opt)

    return train


def test_a_probe_whose_steps_spread_widely_measures_more_of_them_and_says_its_figure_is_uncertain(monkeypatch):
    """Issue 52, item 11: a Lightning probe's 5 measured steps held a few slow ones (median 0.21 s, IQR 0.20 s),
    and its mean read 0.59-0.83 of the normal run, whose rate its median step said. A probe whose mean step is
    not settled measures on (up to 4x as long), and says how uncertain its figure still is."""
    FakeClock().install(monkeypatch)
    backend = make_backend("cpu", 0)
    steady = run_probe(_steps_of(0.2, set()), Config(batch_size=16), backend, warmup_steps=2, measured_steps=5)
    assert steady.measured_steps == 5 and steady.samples_per_s == pytest.approx(80.0) and not steady.notes
    spread = run_probe(_steps_of(0.2, {3, 5}), Config(batch_size=16), backend, warmup_steps=2, measured_steps=5)
    assert spread.measured_steps > 20  # five held 2 slow steps of 0.4 s: 57 samples/s, 0.71 of the rate
    assert spread.samples_per_s > 0.9 * 80.0
    assert any("the mean step is still uncertain by ±" in note for note in spread.notes), spread.notes
