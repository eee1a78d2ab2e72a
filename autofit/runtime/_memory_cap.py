"""The memory cap of a normal run: $AUTOFIT_MEMORY_LIMIT makes a run on a large device behave like
one on the target device (or under the limit its config was searched with)."""

from __future__ import annotations

import os

from autofit.units import format_size, parse_size

#: A memory limit for a normal run ("12GiB", or "json": the limit the exported config was searched under).
MEMORY_LIMIT_ENV = "AUTOFIT_MEMORY_LIMIT"


def memory_limit_from_env(searched_memory_limit: int | None) -> int | None:
    """The memory limit a normal run enforces: $AUTOFIT_MEMORY_LIMIT as a size, or "json" for the
    limit the exported config was searched under; None when unset."""
    value = os.environ.get(MEMORY_LIMIT_ENV, "").strip()
    if not value:
        return None
    if value.lower() == "json":
        return searched_memory_limit
    return parse_size(value)


def describe_memory_limit(memory_limit: int) -> str:
    """What a normal run says when it caps its own memory, so a later OOM is not taken for the device's."""
    return f"autofit: this run enforces a memory limit of {format_size(memory_limit)} (${MEMORY_LIMIT_ENV})"
