"""SearchOptions: what a search is asked to consider. The decorator's arguments fill it in, CLI flags
override it, and the search reads it: it lives here so that none of them imports another to get it."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Any

from autofit.config import KNOB, MAX_BATCH, Config, precision_of
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
    sharding: tuple[str, ...] | None = None
    """Distributed searches: shardings to consider (ddp, fsdp, fsdp-offload) when the function
    offers its blocks to run.distribute; None: all three."""
    checkpoint: bool = True
    """Consider activation checkpointing when the function offers blocks to run.checkpoint()."""
    checkpoint_policy: tuple[str, ...] | None = None
    """Checkpoint policies to consider (full, selective; see CHECKPOINT_POLICIES); None: both."""
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
        for name in ("precision", "sharding", "checkpoint_policy"):  # the values a knob may take (autofit.knobs)
            for value in getattr(self, name) or ():
                KNOB[name].check(value)
        if self.checkpoint_policy is not None and not self.checkpoint_policy:
            raise UsageError("The checkpoint policy list must not be empty.")
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

    def merged(self, **overrides: Any) -> SearchOptions:
        """These options with every override that is not None applied (CLI flags win)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def renamed(old: str, new: str) -> None:
    """Say, in one line, that a name users may still pass was renamed (it keeps working for now)."""
    print(f"autofit: {old} is deprecated and will be removed: use {new}", file=sys.stderr)
