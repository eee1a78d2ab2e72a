"""The knobs: every setting of a training config, declared once, as metadata on its `Config` field.

A knob says its type, values, default, help, how a config names it, and when a search considers it.
Everything else is derived from the declaration, never written again by hand: Config's checks, its JSON
(`to_dict`/`from_dict`) and `label()`, the search space (a Strategy is one value of each knob of order
"memory", each knob's values from what the function offers: `Offers`, below), the study's trial params and
frame columns, and `autofit probe`'s flags. CONTRIBUTING.md ("Adding a knob") walks through adding one.

This module imports nothing of autofit's but its errors: `autofit.config` declares the knobs with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from autofit.errors import UsageError

#: How a knob changes a step, which tells the planner how to order it: "size" (the size a search climbs: the
#: micro-batch, the token caps), "memory" (the size a config fits at moves with it: one axis of a strategy,
#: climbed by memory), "compute" (speed only, memory the same: compare at a size), or "input" (the data
#: pipeline: tried on the leader once the rest is settled).
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
    """What the training function must offer for a search to consider the knob: a field of `Offers`, the
    record the runtime notes in the probe's child (the knob is searched where that field is noted: true, or
    a count of blocks). None only for the size a search climbs (`order` "size"): `knobs()` refuses it else."""
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
    needs: str = ""
    """The knob (by name) that must be set (non-zero, true) for this one to act (the checkpoint policy acts
    on checkpointed blocks only); where it is not, configs that differ in this one alone are the same."""
    lever: bool = False
    """A memory lever, or part of one (the checkpoint policy acts beside the checkpointed blocks): away from their
    defaults the levers trade speed for memory (recompute, host copies) and change nothing else, so the planner
    probes them only where memory stops the climb of the strategy without any (rule 12): at a batch that one
    fits, a lever only adds work."""
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

    def acting(self, item: Any) -> Any:
        """The knob's value in `item` (a Config or Strategy) as it acts: its default where `needs` is not set."""
        return getattr(item, self.name) if not self.needs or getattr(item, self.needs) else self.default

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
    """The knobs a dataclass (Config) declares, in its fields' order (its label's order), each named; raise
    UsageError for a declaration a search could not take (see `declaration_error`)."""
    declared = tuple(replace(f.metadata["knob"], name=f.name) for f in fields(record) if "knob" in f.metadata)
    for knob in declared:
        if (why := declaration_error(knob, {k.name for k in declared})) is not None:
            raise UsageError(why)
    return declared


def declaration_error(knob: Knob, names: set[str]) -> str | None:
    """Why a search could not take `knob` (None: it can): a knob that is not the size must name its offer, an
    `Offers` field, or the search would make it a trial param of every study and never try another value; an
    offer that is no such field is never noted, so the knob would never be searched."""
    if knob.order not in ORDERS:
        return f"A knob's order must be one of {', '.join(ORDERS)}, but {knob.name} has {knob.order!r}."
    if knob.offer is None and knob.order != "size":
        return (f"A knob must name what the function offers for a search to consider it (an Offers field: "
                f"{', '.join(OFFERS)}), but {knob.name} has none: give it an offer, noted in autofit/runtime.")
    if knob.offer is not None and knob.offer not in OFFERS:
        return (f"A knob's offer must be one the runtime notes (an Offers field: {', '.join(OFFERS)}), but "
                f"{knob.name} has {knob.offer!r}: add the field to Offers and note it where the runtime applies it.")
    if knob.needs and knob.needs not in names:
        return f"A knob's needs must name another knob, but {knob.name} needs {knob.needs!r}."
    return None


@dataclass
class Offers:
    """What a training function offered its run, and what the run saw of it: noted by the runtime in the
    probe's child (autofit.runtime's KnobPanel, Run and StepFeed) and sent to the search as this one record
    (`to_dict`: the form a probe's result and a study keep). A knob's `offer` names one of these fields: a
    search considers the knob where the field is noted (`noted`), and spends no probe on it elsewhere."""

    autocast: bool = False
    """Entered run.autocast() (or reads run.precision): the precision is searched."""
    backward: bool = False
    """Calls run.backward() (or reads the accumulation): the accumulation is searched."""
    checkpoint_blocks: int | None = None
    """Blocks offered to run.checkpoint() (None: never called): the checkpointed blocks and policy are searched."""
    batches: bool = False
    """Takes its batches from run.batches() (or reads run.batch_size): the micro-batch is searched."""
    shard_blocks: int | None = None
    """Blocks offered to run.distribute(blocks=...): how the ranks hold the model is searched (with several ranks)."""
    compile: bool = False
    """A model offered to run.compile(): torch.compile is searched."""
    channels_last: bool = False
    """A model offered to run.channels_last(): its memory format is searched."""
    loader: bool = False
    """The data comes through run.loader() (or run.token_batches()): its workers, pinning and prefetch are searched."""
    declared_workers: int | None = None
    """The workers the script declared to the training run.loader() (0: DataLoader's default)."""
    followed: bool = False
    """The function's own loop steps its optimizer: followed through step hooks."""
    longest_sample: int | None = None
    """run.token_batches(): batches by tokens, its longest sample (the search climbs max_tokens from it)."""
    token_envelope: Any = None
    """The micro-batches by tokens that ran (a probe's: the best-config file's envelope); the child's own
    type there (autofit.runtime's TokenEnvelope), its dict once sent."""
    pad_multiple: bool = False
    """Reads run.pad_multiple (its collate pads a batch's length up to it; the HF adapter's collator): searched."""
    sdpa_backends: list | None = None
    """The kernels of scaled_dot_product_attention that run the function's calls, the one PyTorch picks left out,
    noted at a probe's first calls where there is another: the kernel is searched among them."""
    forces_tf32: bool = False
    """The function turned TF32 on for float32 matmuls itself (nanoGPT): fp32 and tf32 run the same math."""
    own_batch: int | None = field(default=None, metadata={"search": True})
    """Set by the search, not the child: the batch of a loop that reads no batch knob (not searched)."""

    def noted(self, offer: str) -> bool:
        """Whether the function offered `offer` (a field: true, or a count of blocks above 0)."""
        return bool(getattr(self, offer))

    def to_dict(self) -> dict:
        """The record as a probe's result and a study keep it: every field, by its name (derived from the
        fields, so one added is never left out on its way to the search; the knob-usage dict of old studies
        had the same keys, fewer of them); a value with a dict form of its own (the child's token envelope)
        as that dict."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict | None) -> Offers | None:
        """The record from its dict (a probe's or a study's, old ones included: a key absent is not noted,
        a key this version does not know is left out), field by field as `to_dict` writes them."""
        if data is None:
            return None
        known = {f.name for f in fields(cls)}
        return cls(**{name: value for name, value in data.items() if name in known})

    @classmethod
    def assumed(cls) -> Offers:
        """What a search assumes before its first probe reports: precision and accumulation may be searched
        (the pilot runs the device's first precision), nothing else is offered."""
        return cls(autocast=True, backward=True)


#: The offers the runtime notes: `Offers`' fields (but those the search sets) that a knob may name as its `offer`.
OFFERS: tuple[str, ...] = tuple(f.name for f in fields(Offers) if not f.metadata.get("search"))


def _plain(value: Any) -> Any:
    """A field's value as a record's dict holds it: its own dict form where it has one."""
    return value.to_dict() if hasattr(value, "to_dict") else value


def label(item: Any, declared: tuple[Knob, ...]) -> str:
    """The words of every knob of `declared` that `item` (a Config, or a Strategy: it has some of them) holds."""
    words = [k.label(getattr(item, k.name), item) for k in declared if hasattr(item, k.name)]
    return " ".join(w for w in words if w)
