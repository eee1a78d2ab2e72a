"""The Run API in-process: accumulation, checkpointing, device moves, step counting."""
import pytest
import torch

from autofit.config import Config
from autofit.normal_run import report_run
from autofit.runtime import ProbeFinished, Run, checkpoint_policy_of


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
    times, samples, tokens = run.control.clock.measured()
    assert len(times) == 4
    assert samples == 4 * 3 * 4  # measured steps x accumulation x micro-batch
    assert tokens == samples * 10
    assert run.control.checked_losses == 6  # the optimizer stepped once per 3 micro-batches
    assert run.control.losses_finite()


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
    assert [(checkpoint_policy_of(b) is not None) for b in blocks] == [True] * 3 + [False] * 2
    assert list(blocks.state_dict()) == keys
    assert run.control.knobs.checkpoint_blocks == 5


class Counting(torch.nn.Module):
    """A block that counts its forward passes (a checkpointed one runs again in backward)."""

    calls = {"n": 0}

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        Counting.calls["n"] += 1
        return torch.relu(self.lin(x))


def test_checkpointing_recomputes_forward_in_backward():
    calls = Counting.calls

    for segments, expected in ((0, 2), (2, 4)):
        calls["n"] = 0
        blocks = torch.nn.ModuleList([Counting(), Counting()])
        Run(Config(batch_size=2, checkpoint_segments=segments)).checkpoint(blocks)
        h = torch.randn(2, 4, requires_grad=True)
        for b in blocks:
            h = b(h)
        h.sum().backward()
        assert calls["n"] == expected


def test_a_model_met_again_with_fewer_checkpointed_blocks_recomputes_only_those():
    # A model built once (at import: tests/corpus/late_device.py) meets several configs in one process
    # (probes in a CUDA worker): the blocks a config leaves out must run without checkpointing again.
    calls = Counting.calls

    blocks = torch.nn.ModuleList([Counting(), Counting()])
    keys = list(blocks.state_dict())
    for segments, expected in ((2, 4), (1, 3), (0, 2), (2, 4)):
        calls["n"] = 0
        Run(Config(batch_size=2, checkpoint_segments=segments)).checkpoint(blocks)
        h = torch.randn(2, 4, requires_grad=True)
        for b in blocks:
            h = b(h)
        h.sum().backward()
        assert calls["n"] == expected, segments
        assert [(checkpoint_policy_of(b) is not None) for b in blocks] == [i < segments for i in range(2)]
        assert list(blocks.state_dict()) == keys
    assert "forward" in vars(blocks[0])
    Run(Config(batch_size=2)).checkpoint(blocks)
    assert "forward" not in vars(blocks[0])  # the class's own forward again


def test_autocast_uses_the_precision():
    lin = torch.nn.Linear(4, 4)
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        run = Run(Config(batch_size=1, precision=precision))
        with run.autocast():
            assert lin(torch.randn(2, 4)).dtype == dtype
    assert run.control.knobs.autocast


def test_fp16_scales_the_loss_and_others_do_not():
    """fp16's GradScaler multiplies the loss (65536 at first) before backward; bf16 needs no scaling."""
    for precision, scale in (("fp16", 2.0**16), ("bf16", 1.0)):
        model = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.ones_(model.weight)
        run = Run(Config(batch_size=1, precision=precision, accumulation_steps=2))
        run.backward(model(torch.ones(1, 1)).sum(), torch.optim.SGD(model.parameters(), lr=0.1))  # no step yet
        assert model.weight.grad.item() == pytest.approx(scale / 2), precision


def test_samples_counted_from_dicts():
    run = Run(Config(batch_size=3), probing=True, warmup_steps=0, measured_steps=1)
    with pytest.raises(ProbeFinished):
        for _ in run.batches([{"ids": torch.zeros(3, 7)}] * 5, tokens=lambda b: b["ids"].numel()):
            pass
    _, samples, tokens = run.control.clock.measured()
    assert (samples, tokens) == (3, 21)


def test_a_probe_measures_at_least_its_minimum_time():
    """Fast steps: five of them are too short to time, so the probe keeps measuring."""
    run = Run(Config(batch_size=4), probing=True, warmup_steps=1, measured_steps=5,
              min_measure_s=0.05, max_measured_steps=10_000)
    with pytest.raises(ProbeFinished):
        _loop(run, n_batches=100_000)
    assert run.control.clock.steps_measured > 5
    assert run.control.clock.measured_time_s >= 0.05
    assert run.control.clock.measured_samples == 4 * run.control.clock.steps_measured


def test_a_probe_stops_extending_at_its_step_cap():
    run = Run(Config(batch_size=4), probing=True, warmup_steps=0, measured_steps=3,
              min_measure_s=3600.0, max_measured_steps=7)
    with pytest.raises(ProbeFinished):
        _loop(run, n_batches=1000)
    assert run.control.clock.steps_measured == 7


def test_a_long_normal_run_holds_constant_memory():
    """Run keeps totals and a bounded window in a normal run, never one entry per step."""
    import tracemalloc

    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(2, 3)
    run = Run(Config(batch_size=2), probing=False, warmup_steps=2)

    def train(steps: int) -> None:
        for batch in run.batches(x.expand(2, 3).clone() for _ in range(steps)):
            loss = model(batch).pow(2).mean()
            run.backward(loss, opt)

    train(3000)  # fills the bounded window
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    train(6000)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert run.optimizer_steps == 9000
    assert run.control.checked_losses == 0  # a normal run keeps nothing per step
    assert len(run.control.clock.step_times) <= 256
    assert grown < 64 * 1024, f"Run grew by {grown} bytes over 6000 steps"
    summary = run.control.summary()
    assert summary["measured_steps"] == 9000 - 2 and summary["samples_per_s"] > 0


def test_a_normal_run_reports_its_throughput(tmp_path, monkeypatch, capsys):
    report = tmp_path / "run.json"
    monkeypatch.setenv("AUTOFIT_RUN_REPORT", str(report))
    run = Run(Config(batch_size=4), probing=False, warmup_steps=2)
    _loop(run, n_batches=20)
    run.finish()
    report_run(run)
    import json

    data = json.loads(report.read_text())
    assert data["optimizer_steps"] == 20 and data["measured_steps"] == 18
    assert data["samples_per_s"] == pytest.approx(18 * 4 / data["measured_s"])
    assert "trained 20 optimizer steps with fp32 b=4" in capsys.readouterr().err


def test_a_normal_run_reads_the_allocators_retries_after_its_warm_up_and_says_so(tmp_path, monkeypatch, capsys):
    """CUDA's num_alloc_retries, as the device backend reads it (a counter here that every step raises by 2)."""
    report = tmp_path / "run.json"
    monkeypatch.setenv("AUTOFIT_RUN_REPORT", str(report))
    retries = [0]
    run = Run(Config(batch_size=4), probing=False, warmup_steps=2, alloc_retries=lambda: retries[0])
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in run.batches([torch.randn(4, 3) for _ in range(10)]):
        run.backward(model(x).mean(), opt)
        retries[0] += 2
    run.finish()
    report_run(run)
    import json

    assert json.loads(report.read_text())["alloc_retries"] == 2 * 8  # the 8 steps after the warm-up's 2
    assert ("autofit: the allocator freed its cache and retried 16 allocations after warm-up: this run is at the "
            "edge of the device's memory") in capsys.readouterr().err
    quiet = Run(Config(batch_size=4), probing=False, warmup_steps=2)  # a CPU's: no counter, nothing said
    _loop(quiet, n_batches=5)
    quiet.finish()
    report_run(quiet)
    assert json.loads(report.read_text())["alloc_retries"] is None and "retried" not in capsys.readouterr().err


def test_a_normal_run_shorter_than_its_warm_up_says_what_it_trained(capsys):
    """A large batch over small data can end within the warm-up: nothing is timed, and the run still
    says what it trained."""
    run = Run(Config(batch_size=4), probing=False, warmup_steps=2)
    _loop(run, n_batches=2)
    run.finish()
    report_run(run)
    said = capsys.readouterr().err
    assert "trained 2 optimizer steps with fp32 b=4: too few to time after 2 warm-up steps" in said


@pytest.mark.parametrize(("precision", "expected"), [("fp32", "ieee"), ("tf32", "tf32"), ("bf16", "ieee")])
def test_precision_holds_for_the_whole_cuda_run_and_is_restored(precision, expected):
    """TF32 is set for forward, backward and optimizer through the current API, then restored."""
    from autofit.runtime import precision_scope

    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before = (matmul.fp32_precision, conv.fp32_precision)
    with precision_scope(precision, torch.device("cuda")):
        assert (matmul.fp32_precision, conv.fp32_precision) == (expected, expected)
    assert (matmul.fp32_precision, conv.fp32_precision) == before


def test_a_script_that_set_the_new_tf32_api_still_probes():
    """Reading a legacy allow_tf32 flag after the new API was set raises; autofit never does."""
    from autofit.runtime import precision_scope

    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = "tf32"  # what a user's script may do at import
    try:
        with precision_scope("fp32", torch.device("cuda")):
            assert matmul.fp32_precision == "ieee"
        assert matmul.fp32_precision == "tf32"
    finally:
        matmul.fp32_precision = before


def test_precision_scope_changes_nothing_on_cpu():
    from autofit.runtime import precision_scope

    before = torch.backends.cuda.matmul.fp32_precision
    with precision_scope("tf32", torch.device("cpu")):
        assert torch.backends.cuda.matmul.fp32_precision == before


def test_sticky_cuda_errors_break_the_device_and_ooms_do_not():
    from autofit.runtime import breaks_the_device

    assert breaks_the_device(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert breaks_the_device(RuntimeError("CUDA error: device-side assert triggered"))
    assert not breaks_the_device(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not breaks_the_device(ValueError("shapes do not match"))
    if hasattr(torch, "AcceleratorError"):
        assert breaks_the_device(torch.AcceleratorError("CUDA error: unspecified launch failure"))


def test_a_probe_over_data_smaller_than_its_batch_stops_instead_of_spinning():
    """drop_last over fewer samples than the batch yields nothing: every epoch is empty."""
    from torch.utils.data import DataLoader, TensorDataset

    from autofit.runtime import DataTooSmall

    loader = DataLoader(TensorDataset(torch.randn(10, 3)), batch_size=16, drop_last=True)
    run = Run(Config(batch_size=16), probing=True, warmup_steps=1, measured_steps=2)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(DataTooSmall, match="larger than the data can feed"):
        for _ in range(10**6):
            for (x,) in run.batches(loader):
                run.backward(model(x).mean(), opt)


def test_the_sampler_has_set_epoch_in_one_process_too():
    """A DDP script calls `sampler.set_epoch(epoch)`; the same script run without torchrun must too."""
    run = Run(Config(batch_size=4), torch.device("cpu"), probing=False)
    data = torch.utils.data.TensorDataset(torch.arange(20))
    sampler = run.sampler(data)
    sampler.set_epoch(0)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert sorted(first) == sorted(second) == list(range(20))  # the whole dataset, each sample once
    assert first != second  # a new epoch, a new order
    assert list(run.sampler(data, shuffle=False)) == list(range(20))


