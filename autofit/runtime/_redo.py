"""OOM resilience for the real run: a step that runs out of memory is redone with a smaller
micro-batch and more accumulation, so the global batch and the optimizer's view stay the same.

A probe meets only the shapes it was given; a real run later meets a longer sequence, a bigger
image or a fragmented allocator. Crashing there loses hours; silently changing the global batch
(what the batch-size finders do) changes the training. This module owns the pieces: which smaller
config keeps the global batch, how the memory of
the failed step is handed back, and how the change is told and recorded.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

from autofit.config import Config

#: Set to 0 to let a real run's OOM propagate as it would without autofit.
RECOVERY_ENV = "AUTOFIT_OOM_RECOVERY"


class OutOfMemoryAtBatchOne(RuntimeError):
    """A step ran out of memory at micro-batch 1: no smaller micro-batch can keep this run alive."""


def recovery_enabled(default: bool = True) -> bool:
    """The decorator's choice, unless $AUTOFIT_OOM_RECOVERY says otherwise (0/false/no/off)."""
    value = os.environ.get(RECOVERY_ENV)
    if value is None or value == "":
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


def lowered(config: Config) -> Config | None:
    """The config with the largest micro-batch at most half of this one that divides it, and the
    accumulation raised to keep the global batch; None at micro-batch 1.

    Halving for even sizes (32 -> 16 x acc 2); an odd size goes to its largest proper divisor
    (24 -> 12, 9 -> 3, 7 -> 1), because a micro-batch that does not divide the loader's batch would
    give micro-batches of unequal size, and averaging their losses would weigh samples unequally.
    """
    size = config.batch_size
    smaller = next((d for d in range(size // 2, 0, -1) if size % d == 0), None)
    if smaller is None:
        return None
    return replace(config, batch_size=smaller, accumulation_steps=config.accumulation_steps * (size // smaller))


@dataclass(frozen=True)
class Lowering:
    """One change of config in a real run: where the OOM surfaced and what the run goes on with."""

    step: int
    """The optimizer step (1-based) that ran out of memory and was redone."""
    where: str
    """"forward" (inside run.autocast()), "backward" or "optimizer step"."""
    before: Config
    after: Config
    memory_bytes: int | None
    """What the process held when the OOM was caught (the limit's way of counting), if known."""
    at: float
    restart: bool = False
    """Before the first optimizer step: the function was started again rather than the step redone."""

    def message(self) -> str:
        action = "starting again" if self.restart else "redoing the step and going on"
        return (f"autofit: out of memory in the {self.where} of step {self.step} with {self.before.label()}; "
                f"{action} with {self.after.label()} (global batch {self.after.global_batch} unchanged). "
                f"Search again to find the fastest config that fits.")

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "where": self.where, "before": self.before.to_dict(),
                "after": self.after.to_dict(), "memory_bytes": self.memory_bytes,
                "restart": self.restart, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at))}


def announce(lowering: Lowering) -> None:
    print(lowering.message(), file=sys.stderr, flush=True)


def lowered_path(config_path: str) -> str:
    """Where a run records the config it lowered to: beside the exported file it started from
    (studies/gpt.train.cpu.best.json -> studies/gpt.train.cpu.lowered.json)."""
    base = config_path[: -len(".best.json")] if config_path.endswith(".best.json") else os.path.splitext(config_path)[0]
    return base + ".lowered.json"


def record_lowerings(path: str, started_with: Config, lowerings: list[Lowering], script: str | None) -> None:
    """Write what the run lowered to, so the next search (and the user) can read it."""
    document = {
        "schema": "autofit.lowered/1",
        "script": script,
        "started_with": started_with.to_dict(),
        "ended_with": lowerings[-1].after.to_dict(),
        "lowerings": [item.to_dict() for item in lowerings],
    }
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(document, handle, indent=2)
        handle.write("\n")
    os.replace(temporary, path)


def read_lowerings(path: str) -> dict[str, Any] | None:
    """What a real run recorded beside a best-config file, or None."""
    try:
        with open(path) as handle:
            document = json.load(handle)
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) and document.get("schema") == "autofit.lowered/1" else None
