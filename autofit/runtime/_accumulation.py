"""A probe's accumulation: it runs at most `PROBE_ACCUMULATION` micro-batches per optimizer step, and
prices a step of its config's longer accumulation from the micro-batches it timed.

Why: a probe measures a few optimizer steps, and a step of a config that keeps a large global batch
with a small micro-batch is long (nanoGPT's defaults: 120 micro-batches of 4, about 3 s on an H100).
At a fixed global batch the smallest micro-batch, which a search tries first, was the longest probe,
and such probes timed out. A step of A micro-batches costs its first micro-batch (after the optimizer
zeroed the gradients), A - 2 alike in the middle, and its last with the optimizer step (DDP's
all-reduce, clipping, the scaler, the loop's own logging): T(A) = T(k) + (A - k) x t_inner for any
k >= 3 that keeps that shape. So a probe runs k = min(A, PROBE_ACCUMULATION) micro-batches (`Config.probe_accumulation`) a step (what
`run.accumulation_steps` and `run.global_batch` say in it), times its steps as usual and the micro-batches
between each step's first and last exactly (`InnerSpans`: the device synchronised at both ends), and
reports the throughput of a step of A (`price_steps`). Memory is the same either way: the gradients are
held from the first micro-batch to the optimizer step, however many come between.

`watch_backward` tells the spans where a micro-batch ends (its backward returns), whoever calls it: a
loop autofit drives, one it follows, a framework's trainer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class InnerSpans:
    """The micro-batches between the first and the last of each measured optimizer step, timed exactly:
    the device is synchronised where the step's first micro-batch ends and where its next-to-last ends.
    Only where a probe prices a longer accumulation than it runs (`pricing`), and only with 3 or more
    micro-batches a step (fewer have no middle).

    Where the steps are regular (each holds `per_step` micro-batches of `backwards_per_micro` backward calls,
    learnt again from every step that held a multiple), two synchronisations a step place the span. A
    measured step that held another number (an extra backward() before it, a token guard's split, a
    GradScaler's skipped step within it) times nothing; after it, every backward call of a measured step is
    synchronised (`every`), and each step's span is read once it closed, whatever it held."""

    per_step: int
    """Micro-batches the probe's loop runs per optimizer step (k)."""
    synchronize: Callable[[], None]
    pricing: bool = False
    time_s: float = 0.0
    micro_batches: float = 0.0
    backwards_per_micro: int = 1
    """Backward calls per micro-batch, learned from the steps so far (a GAN's loop calls two or three)."""
    every: bool = False
    """A measured step held another number of backward calls than its pattern: each backward call of the
    measured steps after it is synchronised, and a step's span is known once it closed."""
    _in_step: int = 0
    _timed: bool = False  # a backward call of this step came in a measured step
    _opened: float | None = None
    _span_s: float | None = None  # regular: this step's span, counted if the step held its pattern
    _returns: list[float] = field(default_factory=list)  # every: the synchronised returns after the first

    def backward_done(self, measuring: bool) -> None:
        """A backward call returned, in a measured step or not."""
        self._in_step += 1
        if not (measuring and self.pricing) or self.per_step < 3:
            return
        self._timed = True
        if self.every:
            self.synchronize()
            now = time.perf_counter()
            if self._opened is None:
                self._opened = now
            else:
                self._returns.append(now)
            return
        first, next_to_last = self.backwards_per_micro, self.backwards_per_micro * (self.per_step - 1)
        if self._in_step == first:
            self.synchronize()  # a CPU-GPU sync point: the first micro-batch's work is done
            self._opened = time.perf_counter()
        elif self._in_step == next_to_last and self._opened is not None:
            self.synchronize()
            self._span_s = time.perf_counter() - self._opened

    def step_done(self) -> None:
        """An optimizer step closed: its span counts if it is known, and the next backward call begins the
        next step."""
        held = self._in_step
        if self._timed and self.every and self._opened is not None and self._returns:
            # from the first backward call's return to the next-to-last's (the last's where it held two)
            last = self._returns[-2] if len(self._returns) >= 2 else self._returns[-1]
            calls = max(1, len(self._returns) - 1)
            self._count(last - self._opened, calls * self.per_step / held)
        elif self._timed and not self.every:
            if self._span_s is not None and held == self.backwards_per_micro * self.per_step:
                self._count(self._span_s, self.per_step - 2)
            else:
                self.every = True  # this measured step broke the pattern: time the next ones call by call
        if held and held % self.per_step == 0:
            self.backwards_per_micro = held // self.per_step
        self._in_step, self._timed, self._opened, self._span_s = 0, False, None, None
        self._returns.clear()

    def _count(self, seconds: float, micro_batches: float) -> None:
        self.time_s += seconds
        self.micro_batches += micro_batches

    @property
    def inner_micro_s(self) -> float | None:
        """Seconds of one micro-batch inside a step (None: none was timed)."""
        return self.time_s / self.micro_batches if self.micro_batches else None


@dataclass(frozen=True)
class PricedSteps:
    """How a probe's step of k micro-batches stands for a step of the config's A: `step_s(probe_step)`."""

    factor: float = 1.0
    extra_s: float = 0.0
    scale: float = 1.0
    """Samples (tokens) of a priced step over those of a probe's step: A / k."""
    note: str | None = None

    def step_s(self, probe_step_s: float) -> float:
        """A step of the config's accumulation, for a probe's step of `probe_step_s`."""
        return probe_step_s * self.factor + self.extra_s


def price_steps(ran: int, priced: int, spans: InnerSpans | None) -> PricedSteps:
    """How a step of `priced` micro-batches follows from the probe's steps of `ran` and its inner
    micro-batch: T(A) = T(k) + (A - k) x t_inner; without a timed inner micro-batch (steps of fewer than 3
    backward calls), every micro-batch as the probe's average one (its optimizer step then counts A / k times,
    said in `note`)."""
    if priced <= ran:
        return PricedSteps()
    scale = priced / ran
    inner = spans.inner_micro_s if spans is not None else None
    if inner is None:
        return PricedSteps(factor=scale, scale=scale, note=(
            f"priced {priced} micro-batches a step from the {ran} it ran, each as its average one (no micro-batch "
            f"inside a step was timed: its steps held fewer than 3 backward calls): its optimizer step counts "
            f"{scale:.0f}x, so the step is priced slower than it runs"))
    return PricedSteps(extra_s=(priced - ran) * inner, scale=scale)


@contextmanager
def watch_backward(done: Callable[[], None], before: Callable[[Any], None] | None = None) -> Iterator[None]:
    """Call `done` each time a backward pass returns (`loss.backward()`, a GradScaler's, a trainer's:
    `Tensor.backward` goes through `torch.autograd.backward`), while the block runs, and `before` with its
    tensors as it begins; a backward inside another's hooks counts once."""
    original = torch.autograd.backward
    depth = 0

    def backward(*args, **kwargs):
        nonlocal depth
        if depth == 0 and before is not None:
            before(args[0] if args else kwargs.get("tensors"))
        depth += 1
        try:
            result = original(*args, **kwargs)
        finally:
            depth -= 1
        if depth == 0:
            done()
        return result

    backward.__wrapped__ = original  # type: ignore[attr-defined]
    torch.autograd.backward = backward
    try:
        yield
    finally:
        torch.autograd.backward = original
