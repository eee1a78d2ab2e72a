"""Parse and print the human units autofit takes on the command line and prints: memory sizes, durations, FLOP/s,
and the share of a step spent waiting for data."""

from __future__ import annotations

import re

from autofit.errors import UsageError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")


def parse_size(text: str | int) -> int:
    """Bytes from '2GiB', '512MiB', '1.5G' or a plain number of bytes."""
    if isinstance(text, int):
        return text
    match = _SIZE_RE.match(str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _SIZE_UNITS:
        raise UsageError(f"A memory size must look like 2GiB, 512MiB or 1.5GB, but got {text!r}.")
    value = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if value <= 0:
        raise UsageError(f"A memory size must be positive, but got {text!r}.")
    return value


_COUNT_UNITS = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str | int | float) -> float:
    """A count of tokens or samples from '10B', '500M', '1.5T', '2e9' or a plain number (B: billions)."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]?)\s*", str(text))
        if not match or match.group(2).lower() not in _COUNT_UNITS:
            raise UsageError(f"A count must look like 10B, 500M or 2e9, but got {text!r}.")
        value = float(match.group(1)) * _COUNT_UNITS[match.group(2).lower()]
    if value <= 0:
        raise UsageError(f"A count must be positive, but got {text!r}.")
    return value


def parse_duration(text: str | float | int) -> float:
    """Seconds from '20m', '1h30m', '90s', '45' (seconds)."""
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        s = str(text).strip().lower()
        if re.fullmatch(r"\d+(\.\d+)?", s):
            seconds = float(s)
        elif s and _DURATION_RE.sub("", s) == "":
            factor = {"h": 3600, "m": 60, "s": 1}
            seconds = sum(float(n) * factor[u] for n, u in _DURATION_RE.findall(s))
        else:
            raise UsageError(f"A duration must look like 20m, 1h30m or 90s, but got {text!r}.")
    if seconds <= 0:
        raise UsageError(f"A duration must be positive, but got {text!r}.")
    return seconds


def format_size(n: float | None) -> str:
    """'1.50 GiB' style, for tables and messages."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def format_duration(seconds: float) -> str:
    """'1h02m', '3m20s', '12.5s'."""
    if seconds >= 3600:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    if seconds >= 60:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{seconds:.1f}s"


def format_flops(flops_per_s: float | None) -> str:
    """'312.4 TFLOP/s', '1.2 GFLOP/s': rates of model FLOPs."""
    if flops_per_s is None:
        return "-"
    for unit, scale in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:.1f} {unit}"
    return f"{flops_per_s:.0f} FLOP/s"


#: A probe that waited this share of its measured time for data is called input-bound: below it, a
#: faster loader gains under 1/(1-0.10) = 1.11x, about what the choice between close configs moves;
#: above it, the loader is worth a look before anything else.
INPUT_BOUND_SHARE = 0.10


def input_bound_text(share: float | None) -> str | None:
    """'input-bound: 42% of the time waiting for data' from INPUT_BOUND_SHARE up; None below it."""
    if share is None or share < INPUT_BOUND_SHARE:
        return None
    return f"input-bound: {share:.0%} of the time waiting for data"
