"""The knobs: every setting of a training config, declared once, as metadata on its `Config` field.

A knob says its type, values, default, help, how a config names it, and when a search considers it.
Everything else is derived from the declaration, never written again by hand: Config's checks, its JSON
(`to_dict`/`from_dict`) and `label()`, a Strategy's label, the study's trial params and frame columns,
and `autofit probe`'s flags. CONTRIBUTING.md ("Adding a knob") walks through adding one.

This module imports nothing of autofit's but its errors: `autofit.config` declares the knobs with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from autofit.errors import UsageError

#: How a knob changes a step, which tells the planner how to order it: "memory" (the size a config fits
#: at moves with it: climb it by memory), "compute" (speed only, memory the same: compare at a size), or
#: "input" (the data pipeline: tried on the leader once the rest is settled).
ORDERS = ("size", "memory", "compute", "input")


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One setting of a config (see the module's docstring). `name` is its Config field's, set by `knobs()`."""

    kind: type
    """int, bool or str: the value's type (None too where `optional`)."""
    help: str
    """One line: the command line's help and the reference pages'."""
    default: Any = None
    optional: bool = False
    """None is a value: "as the script declares it" (the loader's knobs), or "off" (the token caps)."""
    choices: tuple = ()
    """The values a str knob takes (checked); for an int or bool knob, the values a search tries."""
    minimum: int | None = None
    maximum: int | None = None
    """An int knob's largest value as a trial param (from `minimum`; the search space gives the others')."""
    label: Callable[[Any, Any], str | None] = lambda value, item: None
    """How a config names the knob in its label (`Config.label()`): (value, the config or strategy) -> words,
    or None where the value says nothing worth a word (its default, mostly)."""
    stored: bool = False
    """Always in a config's JSON; otherwise written only when not the default, so that every study and file
    recorded before the knob came keeps its form."""
    offer: str | None = None
    """What the training function must offer for a search to consider the knob (a name of the search
    space's `offered`: "distribute", "compile", "loader", "selective", "tokens"); None: always a trial param."""
    order: str = "compute"
    """How the planner orders it (see ORDERS)."""
    flag: str | None = None
    """`autofit probe`'s flag (default: --name-with-dashes)."""
    words: str | None = None
    """The knob in an error message (default: the name with spaces)."""
    none_param: Any = None
    """What None is as a trial param (Optuna's int distributions hold no None: 0 for the squares cap)."""
    consider: str = ""
    """The help of the search's list of this knob's values to consider (`autofit search --NAME a,b`,
    `@autofit(NAME=...)`, `SearchSettings(consider={"NAME": ...})`); empty: a search takes no such list."""
    ranks: bool = False
    """Considered only where each probe spans several ranks (`--nproc-per-node`)."""
    supported: Callable[[str], tuple] | None = None
    """The values a device type ("cpu", "cuda") runs; None: every one of `choices`."""
    unsupported: str = ""
    """Why a device runs only some values: the end of the error that refuses one."""
    name: str = ""

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def in_words(self) -> str:
        return self.words or self.name.replace("_", " ")

    @property
    def frame_dtype(self) -> str:
        """The pandas dtype of the knob's column in a study's frame (nullable where None is a value)."""
        if self.kind is bool:
            return "boolean"
        if self.kind is int:
            return "Int64" if self.optional else "int64"
        return "string"

    def check(self, value: Any) -> None:
        """Raise UsageError, in one line, for a value the knob does not take."""
        if value is None and self.optional:
            return
        if self.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise UsageError(f"The {self.in_words} must be a whole number, but got {value!r}.")
        if self.kind is bool and not isinstance(value, bool):
            raise UsageError(f"The {self.in_words} must be true or false, but got {value!r}.")
        if self.kind is str and self.choices and value not in self.choices:
            raise UsageError(f"The {self.in_words} must be one of {', '.join(self.choices)}, but got {value!r}.")
        if self.minimum is not None and value < self.minimum:
            bound = "0 or more" if self.minimum == 0 else f"at least {self.minimum}"
            raise UsageError(f"The {self.in_words} must be {bound}, but got {value}.")

    def held(self, value: Any) -> bool:
        """Whether a config's JSON holds the knob at `value`."""
        return self.stored or value != self.default

    def from_json(self, data: dict) -> Any:
        """The knob's value in a config's JSON (or a trial's params), its default where absent."""
        value = data.get(self.name, self.default)
        if value is None or (self.none_param is not None and value == self.none_param):
            return None if self.optional else self.default
        return self.kind(value)

    def param(self, value: Any) -> Any:
        """The knob's value as a trial param."""
        return self.none_param if value is None and self.none_param is not None else value

    def device_values(self, device: str) -> tuple:
        """The values a search may consider on a device type."""
        return tuple(self.supported(device)) if self.supported else tuple(self.choices)

    def trial_values(self) -> tuple:
        """The values a categorical trial param holds (None first where it is a value)."""
        values = self.choices or ((False, True) if self.kind is bool else ())
        return ((None,) if self.optional else ()) + tuple(values)


def knob(*, default: Any = None, **declaration: Any) -> Any:
    """A Config field that is a knob: `default` its default, the rest the Knob's declaration."""
    return field(default=default, metadata={"knob": Knob(default=default, **declaration)})


def required_knob(**declaration: Any) -> Any:
    """A Config field that is a knob without a default (the micro-batch)."""
    return field(metadata={"knob": Knob(**declaration)})


def knobs(record: Any) -> tuple[Knob, ...]:
    """The knobs a dataclass (Config) declares, in its fields' order (its label's order), each named."""
    return tuple(replace(f.metadata["knob"], name=f.name) for f in fields(record) if "knob" in f.metadata)


def label(item: Any, declared: tuple[Knob, ...]) -> str:
    """The words of every knob of `declared` that `item` (a Config, or a Strategy: it has some of them) holds."""
    words = [k.label(getattr(item, k.name), item) for k in declared if hasattr(item, k.name)]
    return " ".join(w for w in words if w)
