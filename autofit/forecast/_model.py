"""Throughput on a GPU not measured: what was measured, each part scaled by what bounds it.

A step's time per sample on the measured GPU splits into a compute part, the model's FLOPs at that GPU's
achievable matmul rate (MAMF: what a large matmul reaches, not the datasheet's peak), and the rest: the
time the measured MFU says was not spent at that rate. On the target the compute part scales by the
achievable matmul ratio; the rest is memory-bound kernels (which scale with the HBM bandwidth ratio) and
latency (launches, small kernels, synchronisation, which do not scale) in a mix no file records. The
rest's two bounds (bandwidth ratio, no change) bound the forecast; the point is their geometric middle.
Nothing is fitted to a pair: the only free choice, the middle, was made with the llm.c A100/H100 pair
in view, so that pair does not validate it (docs/guide/forecast.md, "How good is it"). The interval's
margin beyond the bounds is fixed until held-out pairs measure it (_pairs).

With a kernel-class profile (`measured["profile"]`, the share of a step's time per class: matmul,
attention, elementwise, optimizer, communication; no probe writes one yet) each class scales by its
own bound and the interval narrows. Without FLOPs per sample (a file from before they were recorded)
the whole step lies between the bandwidth and matmul ratios. From a CPU or an unlisted GPU there is
nothing to scale: the FLOPs at 20-50% of the target's achievable matmul, labelled as such.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autofit.forecast._gpus import GpuSpec
from autofit.forecast._pairs import HELD_OUT, HeldOutPair, interval_margin
#: A forecast from no GPU measurement: the model's FLOPs at this share of the target's achievable matmul.
UNMEASURED_UTILISATION = (0.20, 0.35, 0.50)
COMPUTE_CLASSES = ("matmul", "attention")
BANDWIDTH_CLASSES = ("elementwise", "optimizer")


@dataclass(frozen=True)
class Rate:
    """Samples per second forecast on a target: the point, the interval, and what it rests on."""

    samples_per_s: float
    low: float
    high: float
    basis: str
    """"profile", "mfu", "no-flops" (see MARGIN) or "flops-only" (no GPU measurement)."""
    margin_from: str = ""
    """Where the interval's widening beyond the model's bounds comes from (`interval_margin`)."""

    def scaled(self, factor: float) -> tuple[float, float, float]:
        return self.samples_per_s * factor, self.low * factor, self.high * factor


@dataclass(frozen=True)
class Part:
    """A share of the measured step's time, and the factors (target time over source time) it may scale by."""

    seconds: float
    low: float
    high: float
    point: float


def _rest(seconds: float, source: GpuSpec, target: GpuSpec) -> Part:
    ratio = source.bandwidth / target.bandwidth
    return Part(seconds, min(ratio, 1.0), max(ratio, 1.0), ratio**0.5)


def _parts(seconds: float, flops: float | None, profile: dict[str, float] | None, source: GpuSpec,
           precision: str, target: GpuSpec, target_precision: str) -> tuple[list[Part], str]:
    matmul = source.matmul(precision) / target.matmul(target_precision)
    bandwidth = source.bandwidth / target.bandwidth
    if profile:
        shares = {k: float(v) for k, v in profile.items()}
        compute = sum(shares.get(k, 0.0) for k in COMPUTE_CLASSES) * seconds
        memory = sum(shares.get(k, 0.0) for k in BANDWIDTH_CLASSES) * seconds
        fixed = shares.get("communication", 0.0) * seconds
        rest = max(0.0, seconds - compute - memory - fixed)
        return [Part(compute, matmul, matmul, matmul), Part(memory, bandwidth, bandwidth, bandwidth),
                Part(fixed, 1.0, 1.0, 1.0), _rest(rest, source, target)], "profile"
    if flops is None:
        low, high = sorted((matmul, bandwidth))
        return [Part(seconds, low, high, (matmul * bandwidth) ** 0.5)], "no-flops"
    compute = min(seconds, flops / source.matmul(precision))
    return [Part(compute, matmul, matmul, matmul), _rest(seconds - compute, source, target)], "mfu"


def scale_rate(samples_per_s: float, flops_per_sample: float | None, precision: str, source: GpuSpec | None,
               target: GpuSpec, target_precision: str, profile: dict[str, float] | None = None,
               pairs: Sequence[HeldOutPair] = HELD_OUT) -> Rate | None:
    """The forecast rate on `target` at `target_precision` of a config measured at `samples_per_s` on `source`
    (None: not a listed GPU). None when nothing can be said (no GPU measurement and no FLOPs). The interval is
    the model's bounds widened by a margin the held-out `pairs` measure once there are enough of them."""
    if source is None:
        if not flops_per_sample:
            return None
        low, point, high = (u * target.matmul(target_precision) / flops_per_sample for u in UNMEASURED_UTILISATION)
        return Rate(point, low, high, "flops-only")
    seconds = 1.0 / samples_per_s
    parts, basis = _parts(seconds, flops_per_sample, profile, source, precision, target, target_precision)
    margin, margin_from = interval_margin(basis, pairs)
    time = sum(p.seconds * p.point for p in parts)
    fastest = sum(p.seconds * p.low for p in parts) / margin
    slowest = sum(p.seconds * p.high for p in parts) * margin
    return Rate(1.0 / time, 1.0 / slowest, 1.0 / fastest, basis, f"{margin - 1:.0%} beyond the bounds, {margin_from}")


def naive_ratios(source: GpuSpec, target: GpuSpec, precision: str = "bf16") -> dict[str, float]:
    """The single ratios a forecast is often made with (target over source): dense peak, achievable
    matmul, memory bandwidth; for the benchmark that compares them."""
    return {"peak": target.peaks[precision] / source.peaks[precision],
            "matmul": target.matmul(precision) / source.matmul(precision),
            "bandwidth": target.bandwidth / source.bandwidth}
