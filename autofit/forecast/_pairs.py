"""Held-out pairs: a forecast from a file measured on one GPU against what another GPU measured of the same
program, the pair not used to shape the model. Each is dated and names the log both figures come from
(benchmarks/gpu/results/). Once MIN_PAIRS of one rate basis are recorded, the interval's margin beyond the
model's bounds is the largest error they measured (`interval_margin`), not the fixed `MARGIN`.

The llm.c A100/H100 pair is no held-out pair: the model's one free choice was made with it in view
(docs/guide/forecast.md, "How good is it"). Two held-out pairs were measured in December 2026 (nanoGPT's
defaults, H200 -> H100 at -1.7% and H100 -> H200 at +0.8%), but their H200 logs are not in the repository:
a pair enters here with its log, as `benchmarks/gpu/run_checklist.sh forecast` records it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: The interval's widening beyond the model's bounds until held-out pairs measure it: for what the bounds do
#: not see (clocks, power caps, kernels that reach another share of MAMF at the model's shapes); wider
#: without a profile.
MARGIN = {"profile": 1.05, "mfu": 1.10, "no-flops": 1.15}
#: Held-out pairs of a rate basis from which its margin is measured rather than fixed.
MIN_PAIRS = 5


@dataclass(frozen=True)
class HeldOutPair:
    """A forecast against a measurement of the same program on the target, both rates per GPU in one unit."""

    program: str
    source: str
    target: str
    basis: str
    """The forecast's rate basis (`Rate.basis`): its pairs measure its margin."""
    forecast: float
    measured: float
    date: str
    log: str
    """The file under benchmarks/gpu/results/ both figures come from."""

    @property
    def error(self) -> float:
        return self.forecast / self.measured - 1


#: The held-out pairs whose logs the repository keeps (none yet: see the module's docstring).
HELD_OUT: tuple[HeldOutPair, ...] = ()


def interval_margin(basis: str, pairs: Sequence[HeldOutPair] = HELD_OUT) -> tuple[float, str]:
    """The interval's widening beyond the model's bounds for `basis`, and where it comes from: one plus the
    largest error of its held-out pairs once there are MIN_PAIRS of them, else the fixed MARGIN."""
    measured = [p for p in pairs if p.basis == basis]
    if len(measured) >= MIN_PAIRS:
        return 1 + max(abs(p.error) for p in measured), f"the largest error of {len(measured)} held-out pairs"
    return MARGIN[basis], f"fixed until {MIN_PAIRS} held-out pairs measure it ({len(measured)} so far)"
