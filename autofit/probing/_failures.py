"""The results of probes that never answered: killed at their timeout, or their process died.

Every runner ends up here when it has no result of the probe's own (the worker, the process it
forks for a CPU probe, a torchrun job), so these records read the same whichever runner ran them.
"""

from __future__ import annotations

import os
import signal

from autofit.config import Config
from autofit.probing._record import ProbeResult


def describe_exit(code: int | None) -> str:
    """'exit status 3', 'killed by SIGSEGV': a process's return code (negative: a signal) in words."""
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def log_tail(path: str | None, lines: int = 30) -> str | None:
    """The last lines of a probe's log (faulthandler's stack after a crash), or None."""
    if not path or not os.path.exists(path):
        return None
    with open(path, errors="replace") as handle:
        return "".join(handle.readlines()[-lines:]) or None


def timeout_result(config: Config, *, timeout: float, wall_s: float, memory_limit: int | None,
                   log_path: str | None, ranks: int = 1, traceback: str | None = None) -> ProbeResult:
    """A probe killed at `timeout` seconds (all `ranks` of it)."""
    what = "The probe" if ranks == 1 else f"The probe's {ranks} ranks"
    killed = "was killed" if ranks == 1 else "were killed"
    return ProbeResult(
        status="timeout", config=config, wall_s=wall_s, memory_limit=memory_limit, world_size=ranks,
        error_type="Timeout",
        error_message=f"{what} did not finish within {timeout:.0f}s and {killed}; "
                      f"raise --probe-timeout if one step is really that slow.",
        traceback=traceback, log_path=log_path,
    )


def crash_result(config: Config, message: str, *, error_type: str = "WorkerCrashed", wall_s: float = 0.0,
                 memory_limit: int | None = None, log_path: str | None = None, traceback: str | None = None,
                 ranks: int = 1, peak_bytes: int | None = None,
                 memory_after_bytes: int | None = None) -> ProbeResult:
    """A probe whose process died before it could answer: `message` says which and how."""
    return ProbeResult(
        status="crashed", config=config, wall_s=wall_s, memory_limit=memory_limit, world_size=ranks,
        peak_bytes=peak_bytes, error_type=error_type, error_message=message, traceback=traceback,
        log_path=log_path, memory_after_bytes=memory_after_bytes,
    )
