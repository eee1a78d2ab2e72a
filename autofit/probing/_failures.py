"""The results of probes that never answered: killed at their timeout, or their process died.

Every runner ends up here when it has no result of the probe's own (the worker, the process it
forks for a CPU probe, a torchrun job), so these records read the same whichever runner ran them.
"""

from __future__ import annotations

import os
import signal

from autofit.config import Config
from autofit.probing._progress import ProbeLimits
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


#: Why a runner killed a probe (`ProbeWatch.expired`), as the error type its result carries. A probe the
#: budget cut short is no verdict on its config: nothing was measured, nothing failed.
TIMEOUT_TYPES = {"start": "StartTimeout", "stall": "Timeout", "budget": "BudgetCut"}
BUDGET_CUT = TIMEOUT_TYPES["budget"]


def timeout_result(config: Config, *, limits: ProbeLimits, reason: str, wall_s: float, memory_limit: int | None,
                   log_path: str | None, ranks: int = 1, traceback: str | None = None,
                   progress: tuple[int, int] | None = None) -> ProbeResult:
    """A probe killed for `reason` ("start", "stall" or "budget": `ProbeWatch.expired`), all `ranks` of
    it, with the micro-batches and steps it had done (`progress`)."""
    what = "The probe" if ranks == 1 else f"The probe's {ranks} ranks"
    done = f"{progress[0]} micro-batches ({progress[1]} optimizer steps) done" if progress else "no micro-batch done"
    if reason == "budget":
        message = (f"{what} ran until the search's budget ran out ({done}, {wall_s:.0f}s): not measured; "
                   f"a longer --budget measures it.")
    elif reason == "start":
        message = (f"{what} had not finished its first micro-batch after {limits.start_s:.0f}s (its set-up, its own "
                   f"evaluation and compilation come first) and {'was' if ranks == 1 else 'were'} killed; raise "
                   f"--probe-timeout (or --budget) if its start is really that slow.")
    else:
        message = (f"{what} made no progress for {limits.stall_s:.0f}s ({done}) and "
                   f"{'was' if ranks == 1 else 'were'} killed; raise --probe-timeout if one micro-batch is really "
                   f"that slow.")
    return ProbeResult(
        status="timeout", config=config, wall_s=wall_s, memory_limit=memory_limit, world_size=ranks,
        error_type=TIMEOUT_TYPES[reason], error_message=message, traceback=traceback, log_path=log_path,
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
