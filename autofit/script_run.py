"""`autofit.start(...)`: a script without a train function. Its one call, anywhere at module level,
returns the `Run` this process trains with: a probe's (the worker executes the script from its top and
offers its Run, autofit.runtime.offer_script_run), or, run normally (`python train.py`), the best config
found for this script or the declared defaults, as a decorated function's normal run would."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from autofit.decorator import AutofitFunction, search_options
from autofit.errors import UsageError
from autofit.options import SearchOptions

if TYPE_CHECKING:
    from autofit.runtime import Run


class ScriptFunction(AutofitFunction):
    """A script that calls `autofit.start`, as a normal run sees it: named as its search names it (no
    function: `train`), its arguments compared with those searched."""

    def __init__(self, path: str, options: SearchOptions, args: list[str]) -> None:
        super().__init__(_script_body, options)
        self.script_path = os.path.abspath(path)
        self.script_args = list(args)


def _script_body(run: Run) -> None:
    """Stands for the script's own code (which runs on after `autofit.start` returns)."""


_STARTED: list[Run] = []  # the normal run's one Run, once started
_OPEN = contextlib.ExitStack()  # its active() scope, open until the process ends


def start(**arguments: Any) -> Run:
    """The `Run` this script trains with; call it once, at module level: `run = autofit.start(global_batch=64)`.

    Takes the arguments of `@autofit(...)`. In a probe, the probe's config; run normally, the best
    config found for this script (or the declared defaults, said in one line). The run follows the
    script's own optimizer steps (its `optimizer.step()` is counted; a probe ends after its measured
    steps). See docs/guide/script.md."""
    from autofit.runtime import ONE_START, take_script_run

    options = search_options(**arguments)
    offered = take_script_run(options)
    if offered is not None:
        return offered
    if _STARTED:
        raise UsageError(ONE_START)
    caller = sys._getframe(1).f_code.co_filename
    script = getattr(sys.modules.get("__main__"), "__file__", None) or caller
    # No restart after an OOM: the script's top has run and cannot be started again from in here.
    target = ScriptFunction(script, replace(options, recover_oom=False), sys.argv[1:])
    plan = target.plan_run()
    run = target.make_run(plan=plan)
    _STARTED.append(run)
    _OPEN.enter_context(run.control.active())
    atexit.register(_finish, run, plan.searched_threads)
    return run


def _finish(run: Run, searched_threads: int | None) -> None:
    """At the script's end: close its last step, leave the run's scope, say what it measured (the threads
    it ran on among it: a script sets its own after `autofit.start` as often as before)."""
    from autofit.normal_run import report_run

    run.finish()
    _OPEN.close()
    report_run(run, searched_threads)


__all__ = ["start", "ScriptFunction"]
