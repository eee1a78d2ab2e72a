"""`run.token_batches`: micro-batches within the config's `max_tokens`, real tokens counted, the same order
from the seed, and `global_tokens` turned into accumulation with each micro-batch weighted by its tokens."""

from __future__ import annotations

import torch

from autofit import Config
from autofit.runtime import Ranks, Run
from tests.support.sequences import PAD, Sequences, collate

CPU_OOM = "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to allocate 1"
LENGTHS = [3, 40, 5, 9, 17, 2, 33, 8, 12, 6, 25, 4, 19, 7, 11, 30]


def test_padded_size_stays_within_max_tokens_and_tokens_are_the_real_ones():
    run = Run(Config(batch_size=64, max_tokens=64), "cpu")
    loader = run.token_batches(Sequences(LENGTHS), LENGTHS, collate_fn=collate)
    counted = 0
    with run.control.active():
        for x, y in run.batches(loader):
            assert x.numel() <= 64
            counted += int((y != PAD).sum())
    run.finish()
    assert counted == sum(LENGTHS)
    assert run.control.clock.steps_done == len(loader)
    assert "max_tokens" in run.control.reads and run.control.knobs.longest_sample == 40
    assert 0 < run.control.summary()["padding_share"] < 0.5


def test_without_max_tokens_the_cap_is_the_micro_batch_at_the_longest_length():
    run = Run(Config(batch_size=2), "cpu")
    loader = run.token_batches(Sequences(LENGTHS), LENGTHS, collate_fn=collate)
    assert loader.batch_sampler.max_tokens == 2 * 40


def test_the_order_is_the_seeds_and_skip_resumes_it():
    def order(skip: int = 0) -> list[list[int]]:
        run = Run(Config(batch_size=48, max_tokens=48), "cpu")
        loader = run.token_batches(Sequences(LENGTHS), LENGTHS, collate_fn=collate, seed=5)
        loader.set_epoch(1)
        loader.skip(skip)
        return [x[:, 0].tolist() for x, _ in loader]

    whole = order()
    assert order() == whole
    assert order(skip=2) == whole[2:]


def test_ranks_get_as_many_micro_batches():
    counts = set()
    for rank in range(3):
        run = Run(Config(batch_size=32, max_tokens=32), "cpu", ranks=Ranks(rank=rank, world_size=3))
        counts.add(len(run.token_batches(Sequences(LENGTHS), LENGTHS, collate_fn=collate)))
    assert len(counts) == 1


def _trained(config: Config, global_tokens: int | None) -> tuple[Run, torch.Tensor]:
    torch.manual_seed(3)
    embedding, head = torch.nn.Embedding(7, 8), torch.nn.Linear(8, 7)
    model = torch.nn.Sequential(embedding, head)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    run = Run(config, "cpu", global_tokens=global_tokens)
    loader = run.token_batches(Sequences(LENGTHS), LENGTHS, collate_fn=collate, shuffle=False)
    with run.control.active():
        for x, y in run.batches(loader):
            loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 7), y.reshape(-1), ignore_index=PAD)
            run.backward(loss, optimizer)
    run.finish()
    return run, torch.cat([p.detach().flatten() for p in model.parameters()])


def test_global_tokens_accumulates_about_that_many_and_equals_one_big_batch():
    run, stepped = _trained(Config(batch_size=64, max_tokens=64), global_tokens=sum(LENGTHS))
    batches = run.token_loader.stats().batches
    assert run.config.accumulation_steps == batches  # the whole epoch's tokens: one step
    assert run.control.clock.steps_done == 1
    _, big = _trained(Config(batch_size=1024, max_tokens=1024), global_tokens=None)  # one micro-batch holds all
    assert torch.allclose(stepped, big, atol=1e-5)


def test_global_tokens_keeps_tokens_per_step_whatever_the_cap():
    small, _ = _trained(Config(batch_size=32, max_tokens=32), global_tokens=100)
    large, _ = _trained(Config(batch_size=128, max_tokens=128), global_tokens=100)
    assert small.config.accumulation_steps > large.config.accumulation_steps
    for run in (small, large):
        per_batch = sum(LENGTHS) / run.token_loader.stats().batches
        assert abs(run.config.accumulation_steps * per_batch - 100) <= per_batch / 2 + 1e-9


def test_max_tokens_is_a_positive_whole_number_that_holds_the_samples_cap():
    import pytest

    from autofit.errors import UsageError

    for bad in (0, -4, 2.5, True):
        with pytest.raises(UsageError, match="max tokens"):
            Config(batch_size=1, max_tokens=bad)
    with pytest.raises(UsageError, match="at most the max tokens"):
        Config(batch_size=128, max_tokens=64)
    config = Config(batch_size=64, max_tokens=64)
    assert (config.size, config.label()) == (64, "fp32 max_tokens=64")
    assert config.with_size(16) == Config(batch_size=16, max_tokens=16)
    assert Config(batch_size=8).with_size(4) == Config(batch_size=4)


def test_a_probe_meets_the_epochs_worst_batch_first():
    """A probe opens with a batch no batch of the epoch passes in both padded tokens and padded squares (here
    the 30-wide pair, 60 tokens and 1800 squares, which passes the 40-long sample alone in both)."""
    def padded(x: torch.Tensor) -> tuple[int, int]:
        return x.shape[0] * x.shape[1], x.shape[0] * x.shape[1] ** 2

    epoch = Run(Config(batch_size=64, max_tokens=64), "cpu")
    batches = [padded(x) for x, _ in epoch.token_batches(Sequences(LENGTHS), LENGTHS, collate_fn=collate, seed=0)]
    firsts = set()
    for seed in range(4):
        run = Run(Config(batch_size=64, max_tokens=64), "cpu", probing=True)
        loader = run.token_batches(Sequences(LENGTHS), LENGTHS, collate_fn=collate, seed=seed)
        x, _ = next(iter(loader))
        firsts.add(padded(x))
    assert len(firsts) == 1
    tokens, squares = firsts.pop()
    assert not any(t > tokens and s > squares for t, s in batches) and (tokens, squares) in batches
    assert (tokens, squares) != (40, 1600)  # not merely the longest sample
    normal = Run(Config(batch_size=64, max_tokens=64), "cpu")
    widths = {next(iter(normal.token_batches(Sequences(LENGTHS), LENGTHS, collate_fn=collate, seed=s)))[0].shape[1]
              for s in range(4)}
    assert widths != {40}  # a real run keeps its shuffled order


def test_an_oom_in_a_normal_run_halves_max_tokens_and_cuts_the_batches_by_samples():
    from autofit.runtime import lowered

    assert lowered(Config(batch_size=64, max_tokens=64, accumulation_steps=3)) == Config(batch_size=32, max_tokens=32, accumulation_steps=6)
    assert lowered(Config(batch_size=1, max_tokens=1)) is None
    even = [8] * 16  # 2 batches of 8 samples at a cap of 64
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Embedding(7, 8), torch.nn.Linear(8, 7))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = Run(Config(batch_size=64, max_tokens=64), "cpu", recover_oom=True)
    loader = run.token_batches(Sequences(even), even, collate_fn=collate)
    sizes, failed = [], False
    with run.control.active():
        for x, y in run.batches(loader):
            with run.autocast():
                if run.optimizer_steps == 1 and not failed:
                    failed = True
                    raise RuntimeError(CPU_OOM)
                loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 7), y.reshape(-1), ignore_index=PAD)
            sizes.append(len(x))
            run.backward(loss, optimizer)
    run.finish()
    assert run.config == Config(batch_size=32, max_tokens=32, accumulation_steps=2)
    # the failed forward's loop body runs on once (its loss ignored), then the step is redone in halves
    assert sizes == [8, 8, 4, 4] and run.optimizer_steps == 2


def test_the_decorators_global_tokens_reaches_a_normal_call(tmp_path, monkeypatch):
    from autofit import autofit

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTOFIT_DEVICE", "cpu")
    seen = {}

    @autofit(global_tokens=sum(LENGTHS), default_batch_size=2)
    def train(run):
        model = torch.nn.Sequential(torch.nn.Embedding(7, 8), torch.nn.Linear(8, 7))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = run.token_batches(Sequences(LENGTHS), LENGTHS, collate_fn=collate)
        for x, y in run.batches(loader):
            loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 7), y.reshape(-1), ignore_index=PAD)
            run.backward(loss, optimizer)
        seen.update(steps=run.optimizer_steps, batches=len(loader), accumulation=run.config.accumulation_steps)

    train()
    assert seen["accumulation"] == seen["batches"] > 1 and seen["steps"] == 1  # the epoch's tokens: one step


def _one_epoch(run: Run, loader) -> None:
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, _ in run.batches(loader):
        run.backward(model(x[:, :1].float()).mean(), optimizer)


def test_a_probe_whose_cap_holds_the_whole_data_twice_over_is_data_bound():
    import pytest

    from autofit.runtime import DataTooSmall

    padded = len(LENGTHS) * max(LENGTHS)  # one batch of everything, at the longest length
    for cap, bound in ((2 * padded, True), (padded, False)):
        run = Run(Config(batch_size=cap, max_tokens=cap), "cpu", probing=True, measured_steps=1000)
        loader = run.token_batches(Sequences(LENGTHS), LENGTHS, collate_fn=collate)
        if bound:
            with pytest.raises(DataTooSmall, match="the data is the ceiling"):
                _one_epoch(run, loader)
        else:
            _one_epoch(run, loader)


def test_a_probe_counts_the_real_tokens_of_its_measured_steps_not_the_padding():
    """A search by tokens ranks caps by the probe's tokens/s: the samples' own tokens (the work), not the
    padded size (the memory)."""
    run = Run(Config(batch_size=48, max_tokens=48), "cpu", probing=True, measured_steps=1000)
    loader = run.token_batches(Sequences(LENGTHS), LENGTHS, collate_fn=collate)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    real, padded = [], []
    for x, y in run.batches(loader):
        real.append(int((y != PAD).sum()))
        padded.append(x.numel())
        run.backward(model(x[:, :1].float()).mean(), optimizer)
    measured = slice(run.control.clock.warmup_steps, None)
    assert len(real[measured]) >= 3 and run.control.clock.steps_measured == len(real[measured])
    assert run.control.clock.measured_tokens == sum(real[measured]) < sum(padded[measured])
