"""click parameter types for autofit's domain values: bad input becomes a usage error (exit 2)."""

from __future__ import annotations

import math

import click

from autofit.config import PRECISIONS
from autofit.errors import UsageError
from autofit.units import parse_count, parse_duration, parse_size


class _ParsedType(click.ParamType):
    """A value parsed by one of autofit's unit parsers; its UsageError becomes click's usage error."""

    passthrough: tuple[type, ...] = ()

    def parse(self, value):
        raise NotImplementedError

    def convert(self, value, param, ctx):
        if isinstance(value, self.passthrough):
            return value
        try:
            return self.parse(value)
        except UsageError as exc:
            self.fail(str(exc), param, ctx)


class MemorySize(_ParsedType):
    name = "size"
    passthrough = (int,)

    def parse(self, value):
        return parse_size(value)


class SizeList(click.ParamType):
    """'16GiB,24GiB' -> (17179869184, 25769803776)."""

    name = "sizes"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            sizes = tuple(parse_size(part.strip()) for part in str(value).split(",") if part.strip())
        except UsageError as error:
            self.fail(str(error), param, ctx)
        if not sizes:
            self.fail(f"A list of sizes must look like 16GiB,24GiB, but got {value!r}.", param, ctx)
        return sizes


class Duration(_ParsedType):
    name = "duration"
    passthrough = (float,)

    def parse(self, value):
        return parse_duration(value)


class ChoiceList(click.ParamType):
    """'fp32,bf16' -> ('fp32', 'bf16'), each one of `choices`."""

    def __init__(self, what: str, choices: tuple[str, ...]) -> None:
        self.name = what[:-1] + "ies" if what.endswith("y") else what + "s"  # policies, precisions
        self.what = what
        self.choices = choices

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        names = tuple(p.strip() for p in str(value).split(",") if p.strip())
        bad = [p for p in names if p not in self.choices]
        if bad or not names:
            self.fail(f"The {self.what} must be one of {', '.join(self.choices)}, but got {value!r}.", param, ctx)
        return names


class IntRangeText(click.ParamType):
    """'8:256' -> (8, 256); '64' -> (64, 64)."""

    name = "min:max"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        text = str(value)
        lo, sep, hi = text.partition(":")
        try:
            low, high = int(lo), int(hi if sep else lo)
        except ValueError:
            self.fail(f"A range must look like 8:256, but got {text!r}.", param, ctx)
        if low < 1 or high < low:
            self.fail(f"A range must satisfy 1 <= MIN <= MAX, but got {text!r}.", param, ctx)
        return (low, high)


class IntList(click.ParamType):
    """'1,2,4' -> (1, 2, 4)."""

    name = "ints"

    def __init__(self, minimum: int = 1) -> None:
        self.minimum = minimum

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            values = tuple(int(v) for v in str(value).split(",") if v.strip())
        except ValueError:
            self.fail(f"A list must look like 1,2,4, but got {value!r}.", param, ctx)
        if not values or min(values) < self.minimum:
            kind = "positive integers" if self.minimum == 1 else f"integers of at least {self.minimum}"
            self.fail(f"A list must hold {kind}, but got {value!r}.", param, ctx)
        return values


class Count(_ParsedType):
    """'10B' -> 1e10 (tokens or samples)."""

    name = "count"
    passthrough = (float,)

    def parse(self, value):
        return parse_count(value)


class NameList(click.ParamType):
    """'H100,L4' -> ('H100', 'L4'): names a library function checks (GPU models)."""

    name = "names"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        names = tuple(p.strip() for p in str(value).split(",") if p.strip())
        if not names:
            self.fail(f"A list must look like H100,L4, but got {value!r}.", param, ctx)
        return names


class PriceList(click.ParamType):
    """'H100=2.69,L4=0.6' -> {'H100': 2.69, 'L4': 0.6}: dollars per GPU-hour by GPU name."""

    name = "prices"

    def convert(self, value, param, ctx):
        if isinstance(value, dict):
            return value
        prices = {}
        for part in (p.strip() for p in str(value).split(",") if p.strip()):
            name, _, price = part.partition("=")
            try:
                prices[name.strip()] = float(price)
            except ValueError:
                self.fail(f"A price must look like H100=2.69 (dollars per GPU-hour), but got {part!r}.", param, ctx)
            if not math.isfinite(prices[name.strip()]) or prices[name.strip()] <= 0 or not name.strip():
                self.fail(f"A price must name a GPU and be a positive, finite number, but got {part!r}.", param, ctx)
        return prices


MEMORY_SIZE = MemorySize()
COUNT = Count()
NAME_LIST = NameList()
PRICE_LIST = PriceList()
SIZE_LIST = SizeList()
DURATION = Duration()
PRECISION_LIST = ChoiceList("precision", PRECISIONS)
INT_RANGE = IntRangeText()
INT_LIST = IntList()
GPU_LIST = IntList(minimum=0)
