"""The allocator settings a config was measured under: PyTorch reads them from the environment
(`PYTORCH_CUDA_ALLOC_CONF`, or `PYTORCH_ALLOC_CONF` since 2.9; e.g. `expandable_segments:True`,
which users set to fight fragmentation). They change a config's peak and speed, so the search
records them with the config (its workers inherit the search's environment) and a normal run applies
what the file records, or says how its own differ.

Where the user set none, a CUDA probe and a normal run on CUDA set `DEFAULT_CUDA_ALLOC_CONF`:
expandable segments grow a segment in place instead of caching blocks of fixed sizes, which saved
2-5.5 GB at no measured cost and moved the OOM edge (torchtune #1185, torchrec PR #4584). The user's
own settings always stand, and are what the file records then.
"""

from __future__ import annotations

import os
import sys

VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
#: What CUDA's allocator runs with where the user set nothing (the module's docstring says why).
DEFAULT_CUDA_ALLOC_CONF = "expandable_segments:True"


def user_allocator_settings() -> bool:
    """Whether this process's environment sets the allocator (either variable)."""
    return any(os.environ.get(name) for name in VARIABLES)


def probe_alloc_conf(alloc_conf: str | None, device_type: str) -> str | None:
    """PYTORCH_CUDA_ALLOC_CONF for a search's or a probe's processes: `alloc_conf` where given (`autofit
    search --alloc-conf`), else on CUDA `DEFAULT_CUDA_ALLOC_CONF` unless the user set their own (which the
    processes inherit); None: nothing set on top of the environment."""
    if alloc_conf:
        return alloc_conf
    return DEFAULT_CUDA_ALLOC_CONF if device_type == "cuda" and not user_allocator_settings() else None


def current_allocator_settings(override: str | None = None) -> dict[str, str | None]:
    """This process's allocator settings, as the best-config file records them; with `override`,
    those of a probe process run with PYTORCH_CUDA_ALLOC_CONF set to it (`probe_alloc_conf`)."""
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


def apply_allocator_settings(recorded: dict[str, str | None] | None, device_type: str) -> str | None:
    """A normal run's allocator settings: where the user set none, those `recorded` with its config (a file's
    `allocator`), or on CUDA `DEFAULT_CUDA_ALLOC_CONF` where nothing was recorded (no file, or one written
    before the record). Set in the environment (the CUDA allocator reads it when it starts; torchrun's ranks
    and loader workers inherit it) and, where CUDA already started in this process, in the allocator itself.
    Returns how this process's settings still differ from `recorded` (the user's own stand), for a warning."""
    if user_allocator_settings():
        return allocator_difference(recorded)
    wanted = (dict.fromkeys(VARIABLES, None) | {name: recorded.get(name) for name in VARIABLES} if recorded is not None
              else {"PYTORCH_CUDA_ALLOC_CONF": DEFAULT_CUDA_ALLOC_CONF if device_type == "cuda" else None})
    for name, value in wanted.items():
        if value:
            os.environ[name] = value
    value = next((v for v in wanted.values() if v), None)
    return _set_in_process(value) if value else None


def _set_in_process(value: str) -> str | None:
    """`value` in the CUDA allocator of this process where it already started (a script that touched CUDA at
    import); what could not be set there, for a warning (a backend is chosen once, at CUDA's start)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None  # CUDA reads the environment when it starts
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or torch.cuda.memory._set_allocator_settings
    try:
        setter(value)
    except RuntimeError as error:
        return f"{value} could not be set once CUDA had started ({str(error).splitlines()[0]})"
    return None
