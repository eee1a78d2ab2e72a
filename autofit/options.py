"""SearchOptions: what a search is asked to consider. The decorator's arguments fill it in, CLI flags
override it, and the search reads it: it lives here so that none of them imports another to get it."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from autofit.config import CONSIDERED, KNOB, MAX_BATCH, Config, precision_of
from autofit.errors import UsageError

#: A normal call's micro-batch before any search where the script names none of its own.
_UNSEARCHED_BATCH = 32


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """What the decorator's arguments (and the CLI flags that override them) ask of a search."""

    global_batch: int | None = None
    """Keep micro-batch x accumulation equal to this; accumulation is derived."""
    global_tokens: int | None = None
    """Token batches (run.token_batches): about this many real tokens per optimizer step, all ranks
    together, whatever the micro-batch's cap; accumulation is derived from the data's lengths, and each
    micro-batch's loss is weighted by its tokens."""
    batch_range: tuple[int, int] = (1, MAX_BATCH)
    """Smallest and largest micro-batch (Config.batch_size) to consider (default: no upper bound; memory
    decides)."""
    token_range: tuple[int, int] = (1, MAX_BATCH)
    """Smallest and largest token cap (Config.max_tokens) to consider for a function that batches by tokens
    (run.token_batches); the climb starts at the longest sample whatever the smallest (default: no upper
    bound; memory decides)."""
    precision: tuple[str, ...] | None = None
    """Precisions to consider; None: every one the device supports."""
    accumulation: tuple[int, ...] | None = None
    """Accumulation steps to consider when no global batch is set; None: 1 only."""
    consider: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The values to consider of the knobs that take such a list (autofit.config.CONSIDERED, each with its
    `consider` help: the shardings, the checkpoint policies), by knob name; a knob absent: every value the
    device runs."""
    checkpoint: bool = True
    """Consider activation checkpointing when the function offers blocks to run.checkpoint()."""
    compile: bool = True
    """Consider torch.compile when the function offers its model to run.compile()."""
    default_batch_size: int | None = None
    """Micro-batch of a normal call when no search result exists: the script's own (None: 32, within the
    global batch where one is declared: never the whole global batch at once); with a global batch, the
    accumulation is derived to keep it."""
    default_precision: str | None = None
    """Precision of a normal call when no search result exists: the script's own (one of PRECISIONS, or a
    dtype's name: nanoGPT's `dtype`); None: fp32, unless the declared precisions leave it out."""
    recover_oom: bool = True
    """Called normally, redo a step that runs out of memory with a smaller micro-batch and more
    accumulation (the global batch kept) instead of crashing; $AUTOFIT_OOM_RECOVERY=0 turns it off."""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        lo, hi = self.batch_range
        if lo < 1 or hi < lo:
            raise UsageError(f"The batch range must satisfy 1 <= MIN <= MAX, but got {lo}:{hi}.")
        lo, hi = self.token_range
        if lo < 1 or hi < lo:
            raise UsageError(f"The token range must satisfy 1 <= MIN <= MAX, but got {lo}:{hi}.")
        for value in self.precision or ():
            KNOB["precision"].check(value)
        object.__setattr__(self, "consider", considered_values(self.consider))
        if self.global_batch is not None and self.global_batch < 1:
            raise UsageError(f"The global batch must be at least 1, but got {self.global_batch}.")
        if self.global_tokens is not None and self.global_tokens < 1:
            raise UsageError(f"The global tokens must be at least 1, but got {self.global_tokens}.")
        if self.default_precision is not None:
            object.__setattr__(self, "default_precision", precision_of(self.default_precision))

    def unsearched_config(self) -> tuple[Config, str]:
        """The config a normal call trains with before any search, and how it follows from what the
        user declared: the script's own micro-batch and precision where it passed them (`default_batch_size`,
        `default_precision`), the global batch kept (micro-batch x accumulation; without a micro-batch of
        its own, 32 at most: the whole global batch at once ran nanoGPT's defaults out of memory), the
        micro-batch within the declared range, fp32 unless the declared precisions leave it out."""
        lo, hi = self.batch_range
        wanted = self.default_batch_size or _UNSEARCHED_BATCH
        batch = min(max(wanted, lo), hi)
        accumulation, why = 1, []
        if self.global_batch is not None:
            batch = max([d for d in range(1, min(batch, self.global_batch) + 1) if self.global_batch % d == 0])
            accumulation = self.global_batch // batch
            why.append(f"global batch {self.global_batch} as declared")
        if self.default_batch_size is not None:
            why.append(f"default micro-batch {self.default_batch_size}")
        if self.default_precision is not None:
            precision = self.default_precision
            why.append(f"default precision {precision}")
        else:
            precision = "fp32" if not self.precision or "fp32" in self.precision else self.precision[0]
        config = Config(batch_size=batch, precision=precision, accumulation_steps=accumulation)
        return config, (f" ({', '.join(why)})" if why else "")

    def merged(self, *, consider: Mapping[str, tuple[str, ...]] | None = None, **overrides: Any) -> SearchOptions:
        """These options with every override that is not None applied (CLI flags win), a knob's list of
        values to consider too."""
        kept = {k: v for k, v in overrides.items() if v is not None}
        return replace(self, **kept, consider={**self.consider, **(consider or {})})

    def considered(self, name: str, device: str) -> tuple:
        """The values of knob `name` a search considers on a device type: those declared, else every one
        the device runs."""
        known = KNOB[name].device_values(device)
        return tuple(v for v in self.consider.get(name) or known if v in known)


def considered_values(consider: Mapping[str, Any], device: str | None = None, world_size: int | None = None
                      ) -> dict[str, tuple[str, ...]]:
    """Each knob's list of values to consider, checked (a name of CONSIDERED, a non-empty list of its values;
    one value for one); with a device, values it runs; with the ranks of a probe, several where the knob
    needs them. Raise UsageError, in one line, naming the flag, for the first that is not."""
    checked = {}
    for name, values in consider.items():
        if values is None:
            continue
        known = next((k for k in CONSIDERED if k.name == name), None)
        if known is None:
            raise UsageError(f"A search considers lists of {', '.join(k.name for k in CONSIDERED)}, "
                             f"but got one of {name!r}.")
        values = (values,) if isinstance(values, str) else tuple(values)
        if not values:
            raise UsageError(f"The {known.in_words} list must not be empty.")
        for value in values:
            known.check(value)
        if known.ranks and world_size == 1:
            raise UsageError(f"{known.cli_flag} is for distributed probes, but got {known.cli_flag} {','.join(values)} "
                             f"without --nproc-per-node: add --nproc-per-node N (N ranks per probe).")
        runs = known.device_values(device) if device is not None else values
        unsupported = [v for v in values if v not in runs]
        if unsupported:
            raise UsageError(f"The {known.in_words} must be one the device supports ({', '.join(runs)}), "
                             f"but got {', '.join(unsupported)}: {known.unsupported}")
        checked[name] = values
    return checked


def search_options(
    *,
    global_batch: int | None = None,
    global_tokens: int | None = None,
    batch_range: tuple[int, int] | None = None,
    token_range: tuple[int, int] | None = None,
    precision: tuple[str, ...] | list[str] | str | None = None,
    accumulation: tuple[int, ...] | list[int] | None = None,
    checkpoint: bool = True,
    compile: bool = True,
    default_batch_size: int | None = None,
    default_precision: object = None,
    recover_oom: bool = True,
    batch_size: tuple[int, int] | None = None,
    **consider: tuple[str, ...] | list[str] | str | None,
) -> SearchOptions:
    """The SearchOptions that `@autofit(...)` and `autofit.start(...)` declare (the same arguments); each knob
    of CONSIDERED is a keyword too, its values a list or one value (`NAME=("a", "b")`, `NAME="a"`)."""
    unknown = sorted(set(consider) - {k.name for k in CONSIDERED})
    if unknown:
        raise TypeError(f"search_options() got an unexpected keyword argument {unknown[0]!r}")
    if batch_size is not None:
        if batch_range is not None:
            raise UsageError("Give the micro-batch range once, as batch_range=(lo, hi), but got both "
                             "batch_range= and its deprecated name batch_size=.")
        renamed("@autofit(batch_size=...)", "@autofit(batch_range=(lo, hi))")
        batch_range = batch_size
    return SearchOptions(
        global_batch=global_batch,
        global_tokens=global_tokens,
        batch_range=tuple(batch_range) if batch_range is not None else (1, MAX_BATCH),
        token_range=tuple(token_range) if token_range is not None else (1, MAX_BATCH),
        precision=((precision,) if isinstance(precision, str) else tuple(precision)) if precision is not None else None,
        accumulation=tuple(accumulation) if accumulation is not None else None,
        consider=consider,
        checkpoint=checkpoint,
        compile=compile,
        default_batch_size=default_batch_size,
        default_precision=default_precision,
        recover_oom=recover_oom,
    )


def _with_considered(signature: inspect.Signature) -> inspect.Signature:
    """search_options' signature with each knob of CONSIDERED a keyword in place of `**consider` (what
    `inspect.signature`, the decorator's and the docs show)."""
    params = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    listed = [inspect.Parameter(k.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                annotation="tuple[str, ...] | list[str] | str | None") for k in CONSIDERED]
    return signature.replace(parameters=params[:-1] + listed + params[-1:])


search_options.__signature__ = _with_considered(inspect.signature(search_options))


def renamed(old: str, new: str) -> None:
    """Say, in one line, that a name users may still pass was renamed (it keeps working for now)."""
    print(f"autofit: {old} is deprecated and will be removed: use {new}", file=sys.stderr)
