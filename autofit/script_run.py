"""`autofit.start(...)`: a script without a train function. Its one call, anywhere at module level,
returns the `Run` this process trains with: a probe's (the worker executes the script from its top and
offers its Run, autofit.runtime.offer_script_run), or, run normally (`python train.py`), the best config
found for this script or the declared defaults, as a decorated function's normal run would."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import time
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

RESTART_ENV = "AUTOFIT_SCRIPT_RESTART"
"""Set by autofit when it runs a script again after an out-of-memory: the config it starts with (JSON)."""
RESTART_BEFORE_STEP = 100
"""A script is run again after an OOM only before this optimizer step: a run from its top repeats the steps
done, which is cheap early in training (the micro-batch too large from the start) and not later."""


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
    # No redo of a step inside the run: the script owns its loop. An OOM that reaches the top runs the
    # whole script again at a lower micro-batch instead (_restart_after_oom).
    target = ScriptFunction(script, replace(options, recover_oom=False), sys.argv[1:])
    handed = _handed()
    plan = _restarted(target.plan_run(say=handed is None), handed)  # a restart says its own one line
    run = target.make_run(plan=plan)
    _STARTED.append(run)
    _OPEN.enter_context(run.control.active())
    atexit.register(_finish, run, plan.searched_threads)
    _restart_after_oom(run, plan, options)
    return run


def _restarted(plan: Any, handed: dict[str, Any] | None) -> Any:
    """The plan with the lowered config an earlier execution of this script `handed` on after an OOM, said in
    the one line a restart prints."""
    from autofit.config import Config

    if handed is None:
        return plan
    config = Config.from_dict(handed["config"])
    print(f"autofit: on {plan.device}, started again after an out-of-memory, with {config.label()}", file=sys.stderr)
    return plan._replace(config=config)


def _handed() -> dict[str, Any] | None:
    """What the execution before this one handed on (RESTART_ENV): the config, the one the run started with
    and every lowering so far; read once, so that a process this script starts does not take it."""
    handed = os.environ.pop(RESTART_ENV, None)
    _HANDED[:] = [json.loads(handed)] if handed else []
    return _HANDED[0] if _HANDED else None


_HANDED: list[dict[str, Any]] = []


def _restart_after_oom(run: Run, plan: Any, options: SearchOptions) -> None:
    """An out-of-memory that ends the script early in training runs it again from its top, in a new
    process image, at the next lower micro-batch with the global batch kept (the decorated function's
    fallback, for a script whose steps autofit cannot redo), said in one line and recorded beside the
    config file. Not under torchrun (every rank would have to), not at micro-batch 1, not after
    RESTART_BEFORE_STEP optimizer steps, not with the fallback turned off."""
    from autofit.config import Config
    from autofit.runtime import Lowering, is_oom, lowered, record_lowerings, recovery_enabled

    if not recovery_enabled(options.recover_oom) or run.world_size > 1:
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, traceback: Any) -> None:
        smaller = lowered(run.config) if is_oom(exc) else None
        steps = run.optimizer_steps
        if smaller is None or steps >= RESTART_BEFORE_STEP:
            previous(kind, exc, traceback)
            return
        print(f"autofit: out of memory with {run.config.label()} after {steps} optimizer steps ({type(exc).__name__}); "
              f"a script's own loop cannot redo its step, so {os.path.basename(sys.argv[0])} runs again from its top "
              f"with {smaller.label()} (global batch {smaller.global_batch} unchanged). Search again to find the "
              f"fastest config that fits.", file=sys.stderr, flush=True)
        earlier = _HANDED[0] if _HANDED else {"started_with": plan.config.to_dict(), "lowerings": []}
        lowering = Lowering(steps + 1, "script", run.config, smaller, None, time.time(), restart=True)
        record_lowerings(plan.record_path, Config.from_dict(earlier["started_with"]),
                         [*map(Lowering.from_dict, earlier["lowerings"]), lowering], plan.path)
        _run_again({"config": smaller.to_dict(), "started_with": earlier["started_with"],
                    "lowerings": [*earlier["lowerings"], lowering.to_dict()]})

    sys.excepthook = hook


def _run_again(handed: dict[str, Any]) -> None:
    """This process image replaced by the same command, handed what it starts with; the CPU cap is lifted for
    the new interpreter's imports (its run applies it again)."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
              {**os.environ, RESTART_ENV: json.dumps(handed)})


def _finish(run: Run, searched_threads: int | None) -> None:
    """At the script's end: close its last step, leave the run's scope, say what it measured (the threads
    it ran on among it: a script sets its own after `autofit.start` as often as before)."""
    from autofit.normal_run import report_run

    run.finish()
    _OPEN.close()
    report_run(run, searched_threads)


__all__ = ["start", "ScriptFunction"]
