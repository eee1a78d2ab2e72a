"""SearchOptions: what a search is asked to consider. The decorator's arguments fill it in, CLI flags
override it, and the search reads it: it lives here so that none of them imports another to get it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from autofit.config import MAX_BATCH, check_precision, check_sharding
from autofit.errors import UsageError


@dataclass(frozen=True)
class SearchOptions:
    """What the decorator's arguments (and the CLI flags that override them) ask of a search."""

    global_batch: int | None = None
    """Keep micro-batch x accumulation equal to this; accumulation is derived."""
    batch_size: tuple[int, int] = (1, MAX_BATCH)
    """Smallest and largest micro-batch to consider (default: no upper bound; memory decides)."""
    precision: tuple[str, ...] | None = None
    """Precisions to consider; None: every one the device supports."""
    accumulation: tuple[int, ...] | None = None
    """Accumulation steps to consider when no global batch is set; None: 1 only."""
    sharding: tuple[str, ...] | None = None
    """Distributed searches: shardings to consider (ddp, fsdp, fsdp-offload) when the function
    offers its blocks to run.distribute; None: all three."""
    checkpoint: bool = True
    """Consider activation checkpointing when the function offers blocks to run.checkpoint()."""
    compile: bool = True
    """Consider torch.compile when the function offers its model to run.compile()."""
    default_batch_size: int = 32
    """Micro-batch used when the function is called normally and no search result exists."""
    recover_oom: bool = True
    """Called normally, redo a step that runs out of memory with a smaller micro-batch and more
    accumulation (the global batch kept) instead of crashing; $AUTOFIT_OOM_RECOVERY=0 turns it off."""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        lo, hi = self.batch_size
        if lo < 1 or hi < lo:
            raise UsageError(f"The batch-size range must satisfy 1 <= MIN <= MAX, but got {lo}:{hi}.")
        if self.precision is not None:
            for name in self.precision:
                check_precision(name)
        for name in self.sharding or ():
            check_sharding(name)
        if self.global_batch is not None and self.global_batch < 1:
            raise UsageError(f"The global batch must be at least 1, but got {self.global_batch}.")

    def merged(self, **overrides: Any) -> SearchOptions:
        """These options with every override that is not None applied (CLI flags win)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})
