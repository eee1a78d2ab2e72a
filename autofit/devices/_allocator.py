"""The allocator settings a config was measured under: PyTorch reads them from the environment
(`PYTORCH_CUDA_ALLOC_CONF`, or `PYTORCH_ALLOC_CONF` since 2.9; e.g. `expandable_segments:True`,
which users set to fight fragmentation). They change a config's peak and speed, so the search
records them with the config (its workers inherit the search's environment) and a run under other
settings is warned.
"""

from __future__ import annotations

import os

VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def current_allocator_settings(override: str | None = None) -> dict[str, str | None]:
    """This process's allocator settings, as the best-config file records them; with `override`,
    those of a probe process run with PYTORCH_CUDA_ALLOC_CONF set to it (`autofit search --alloc-conf`)."""
    settings = {name: os.environ.get(name) or None for name in VARIABLES}
    if override:
        settings["PYTORCH_CUDA_ALLOC_CONF"] = override
    return settings


def allocator_difference(recorded: dict[str, str | None] | None) -> str | None:
    """How this process's settings differ from those a config was measured under (None: the same,
    or nothing was recorded)."""
    if not recorded:
        return None
    now = current_allocator_settings()
    changed = [name for name in VARIABLES if (recorded.get(name) or None) != now[name]]
    if not changed:
        return None
    return "; ".join(f"{name} was {recorded.get(name) or 'unset'} in the search and is {now[name] or 'unset'} now"
                     for name in changed)
