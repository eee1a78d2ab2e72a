"""A probe that prices a longer accumulation than it runs (autofit.runtime._accumulation): the micro-batches inside
its measured steps are timed whatever a step outside them held, and its optimizer step counts once a priced step.

The time is a stand-in clock (`time.perf_counter` patched): a micro-batch takes 1 s and the optimizer step 1000 s,
so a step of 32 micro-batches priced from steps of 4 is 1000 + 32 x 1 = 1032 s, and a step priced with its optimizer
counted 8 times (the fallback that prices every micro-batch as the step's average) is 8 x 1004 = 8032 s."""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from autofit import Config
from autofit.runtime import ProbeFinished, Run, price_steps

MICRO_S, OPTIMIZER_S = 1.0, 1000.0


class _StandInTime:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _kept_loop(run: Run, clock: _StandInTime, *, extra_before: bool = False, extra_in_step: int | None = None):
    """A kept loop that reads run.accumulation_steps; one extra backward() before its first step (an off-by-one
    `if i % accum == 0`), or one more micro-batch in its step `extra_in_step`."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def micro_batch() -> None:
        clock.now += MICRO_S
        model(torch.randn(run.batch_size, 8)).pow(2).mean().backward()

    if extra_before:
        micro_batch()
    step = 0
    while True:
        for _ in range(run.accumulation_steps + (step == extra_in_step)):
            micro_batch()
        clock.now += OPTIMIZER_S
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1


def _priced_step_s(monkeypatch, **loop) -> tuple[float, Run]:
    """The step of acc=32 a probe of b=4 prices from its median step of 4 micro-batches, in stand-in seconds."""
    clock = _StandInTime()
    monkeypatch.setattr(time, "perf_counter", clock)
    run = Run(Config(batch_size=4, accumulation_steps=32), "cpu", probing=True, warmup_steps=2, measured_steps=5,
              probe_accumulation=4)
    with pytest.raises(ProbeFinished), run.control.active():
        _kept_loop(run, clock, **loop)
    spans = run.control.clock.inner
    pricing = price_steps(run.config.accumulation_steps, run.control.priced_config.accumulation_steps, spans)
    monkeypatch.undo()
    assert pricing.note is None, pricing.note  # no fallback to the average micro-batch
    return pricing.step_s(statistics.median(run.control.clock.step_times)), run


def test_an_extra_backward_before_the_first_step_leaves_the_measured_steps_timed(monkeypatch):
    """Issue 44, item 4: one odd step, warm-up included, turned the inner timing off for the whole probe, and the
    fallback counted the optimizer step A/k = 8 times (8032 s here; priced/real 0.64 on a real loop at A=32)."""
    priced, run = _priced_step_s(monkeypatch, extra_before=True)
    assert priced == pytest.approx(OPTIMIZER_S + 32 * MICRO_S)
    assert run.control.clock.inner.micro_batches == 5 * 2  # every measured step's 2 inner micro-batches


def test_an_odd_measured_step_is_left_out_and_the_steps_after_it_are_timed_call_by_call(monkeypatch):
    """A measured step of 5 micro-batches (a token guard's split) times nothing; the steps after it are synchronised
    at every backward call, and their inner micro-batches still price the step with its optimizer counted once."""
    priced, run = _priced_step_s(monkeypatch, extra_in_step=3)
    assert priced == pytest.approx(OPTIMIZER_S + 32 * MICRO_S)
    spans = run.control.clock.inner
    assert spans.every and spans.micro_batches == 4 * 2  # the odd step (the 2nd measured) left out
