"""The Run API in-process: accumulation, checkpointing, device moves, step counting."""
from collections import namedtuple

import pytest
import torch

from autofit.run import ProbeFinished, Run, to_device
from autofit.space import Config


def _loop(run, n_batches=100, batch=4):
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [torch.randn(batch, 3) for _ in range(n_batches)]
    for x in run.batches(data, tokens=10):
        with run.autocast():
            loss = model(x).mean()
        run.backward(loss, opt)
    return model, opt


def test_probe_stops_after_warmup_plus_measured_steps():
    run = Run(Config(batch_size=4, accumulation_steps=3), probing=True, warmup_steps=2, measured_steps=4)
    with pytest.raises(ProbeFinished):
        _loop(run)
    assert run.optimizer_steps == 6
    times, samples, tokens = run.clock.measured()
    assert len(times) == 4
    assert samples == 4 * 3 * 4  # measured steps x accumulation x micro-batch
    assert tokens == samples * 10
    assert len(run.losses) == 6  # the optimizer stepped once per 3 micro-batches


def test_not_probing_runs_to_the_end_of_the_data():
    run = Run(Config(batch_size=4, accumulation_steps=2), probing=False)
    _loop(run, n_batches=10)
    run.finish()
    assert run.optimizer_steps == 5


def test_accumulation_matches_one_big_batch():
    torch.manual_seed(0)
    x = torch.randn(8, 3)
    big = torch.nn.Linear(3, 1)
    small = torch.nn.Linear(3, 1)
    small.load_state_dict(big.state_dict())
    opt_big = torch.optim.SGD(big.parameters(), lr=0.5)
    opt_small = torch.optim.SGD(small.parameters(), lr=0.5)
    Run(Config(batch_size=8)).backward(big(x).square().mean(), opt_big)
    before = small.weight.detach().clone()
    run = Run(Config(batch_size=4, accumulation_steps=2))
    run.backward(small(x[:4]).square().mean(), opt_small)
    assert torch.equal(small.weight, before)  # no optimizer step inside an accumulation window
    run.backward(small(x[4:]).square().mean(), opt_small)
    assert torch.allclose(small.weight, big.weight, atol=1e-6)
    assert small.weight.grad is None  # zeroed at the boundary


def test_checkpoint_wraps_only_the_requested_blocks_and_keeps_state_dict():
    blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(5)])
    keys = list(blocks.state_dict())
    run = Run(Config(batch_size=2, checkpoint_segments=3))
    run.checkpoint(blocks)
    assert [getattr(b, "_autofit_checkpointed", False) for b in blocks] == [True] * 3 + [False] * 2
    assert list(blocks.state_dict()) == keys
    assert run.knobs.checkpoint_blocks == 5


def test_checkpointing_recomputes_forward_in_backward():
    calls = {"n": 0}

    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            calls["n"] += 1
            return torch.relu(self.lin(x))

    for segments, expected in ((0, 2), (2, 4)):
        calls["n"] = 0
        blocks = torch.nn.ModuleList([Counting(), Counting()])
        Run(Config(batch_size=2, checkpoint_segments=segments)).checkpoint(blocks)
        h = torch.randn(2, 4, requires_grad=True)
        for b in blocks:
            h = b(h)
        h.sum().backward()
        assert calls["n"] == expected


def test_autocast_uses_the_precision():
    lin = torch.nn.Linear(4, 4)
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        run = Run(Config(batch_size=1, precision=precision))
        with run.autocast():
            assert lin(torch.randn(2, 4)).dtype == dtype
    assert run.knobs.autocast


def test_fp16_uses_a_grad_scaler_and_others_do_not():
    assert Run(Config(batch_size=1, precision="fp16"))._scaler is not None
    assert Run(Config(batch_size=1, precision="bf16"))._scaler is None


def test_to_device_handles_nested_batches():
    Pair = namedtuple("Pair", "x y")
    batch = {"a": torch.ones(2), "b": [torch.zeros(1), (torch.ones(3), "label")], "c": Pair(torch.ones(1), 3)}
    moved = to_device(batch, torch.device("cpu"))
    assert isinstance(moved["c"], Pair) and moved["c"].y == 3
    assert moved["b"][1][1] == "label"
    assert torch.equal(moved["a"], batch["a"])


def test_samples_counted_from_dicts():
    run = Run(Config(batch_size=3), probing=True, warmup_steps=0, measured_steps=1)
    with pytest.raises(ProbeFinished):
        for _ in run.batches([{"ids": torch.zeros(3, 7)}] * 5, tokens=lambda b: b["ids"].numel()):
            pass
    _, samples, tokens = run.clock.measured()
    assert (samples, tokens) == (3, 21)
