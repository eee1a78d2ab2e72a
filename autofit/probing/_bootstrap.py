"""What every child process does before it runs the user's code, and the request loop of those that
serve many requests. The children: the probe worker (autofit.probing._worker_process), a rank of a
torchrun job (autofit.probing._rank_process) and the memory estimator (autofit.memory._estimate_process).

Each of them opens its device, imports the user's script, finds the function, and (but the
estimator, whose tensors are fake) caps its memory; `bootstrap` does that once for all three, in the one
order that keeps the limit honest: the device first (a GPU made current before the user's module
can allocate on it), the import, then the device's caches released and the cap applied, so the
baseline the cap is checked against is what the process needs just to start.

Kept light like the rest of autofit.probing: torch is imported by the device backend when `bootstrap`
runs, never when this module is imported.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autofit.errors import UsageError
from autofit.probing._script import (
    ScriptEntry,
    calls_start,
    find_function,
    load_script,
    may_define_autofit,
    no_function_message,
    script_args_from_env,
)
from autofit.probing._wire import Channel, LoadRequest, failure_reply, internal_failure

Handler = Callable[[dict[str, Any]], dict[str, Any]]


class ScriptError(Exception):
    """The user's module raised while it was imported: their bug, reported with their traceback."""

    def __init__(self, message: str, traceback: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.traceback = traceback


#: Frames under this directory are autofit's own; importlib's are "<frozen ...>".
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def user_traceback(exc: BaseException, script: str | None = None) -> str:
    """The traceback of an exception raised by the user's code, without autofit's or importlib's
    frames: what they need to fix it. `script`: raised at its import, so from its own frame on."""
    frames = exc.__traceback__
    if script is not None:
        start = frames
        while start is not None and start.tb_frame.f_code.co_filename != os.path.abspath(script):
            start = start.tb_next
        frames = start or frames
    kept = [f for f in traceback.extract_tb(frames)
            if not f.filename.startswith(_PACKAGE_DIR) and not f.filename.startswith("<frozen")]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(kept)]
    return "".join(lines + traceback.format_exception_only(type(exc), exc))


@dataclass
class Loaded:
    """The user's function in this process, on its device, under its limit."""

    backend: Any  # autofit.devices.DeviceBackend (imported with the device, in the child)
    fn: Any
    name: str | None
    module: Any = None
    """The user's script, imported (its globals are part of what a probe must find as loaded)."""
    script: str | None = None
    """The script's path: its local modules are found from it (`local_modules`)."""

    def describe(self) -> dict[str, Any]:
        """What the supervisor learns once the function is loaded: its name, the decorator's
        options, and the memory the process holds before any step."""
        options = getattr(self.fn, "options", None)
        return {"function": getattr(self.fn, "__name__", self.name),
                "options": options.__dict__ if options is not None else None,
                "baseline_bytes": self.backend.used_bytes()}


def bootstrap(request: LoadRequest, *, cap_memory: bool = True,
              before_script: Callable[[], None] | None = None) -> Loaded:
    """Open the device, import the script, find the function, release caches, apply the limit.
    `before_script` runs with the device open and nothing of the script run yet (what a process that
    runs a script from its top in every probe must put back before each one).

    Raises UsageError for bad input (no such script or function, a limit below what the process
    needs to start) and ScriptError when the user's module raises at import.
    """
    from autofit.devices import make_backend

    backend = make_backend(request.device, request.index)
    backend.torch_device()  # on a GPU: made current, so the module's own tensors land on it
    if before_script is not None:
        before_script()
    try:
        module, fn = _load(request)
    except UsageError:
        raise
    except SyntaxError as exc:  # one line says it all: where, what, and the text
        where = f"{os.path.basename(exc.filename or request.script)}, line {exc.lineno}"
        text = f": `{exc.text.strip()}`" if exc.text and exc.text.strip() else ""
        raise ScriptError(f"SyntaxError in {where}{text}: {exc.msg}; fix the script and run again", None) from exc
    except BaseException as exc:  # noqa: BLE001 - the user's module failed at import
        raise ScriptError(f"{type(exc).__name__}: {exc}", user_traceback(exc, request.script)) from exc
    backend.release()
    if cap_memory:
        backend.apply_memory_limit(request.budget)
    return Loaded(backend, fn, request.function, module, request.script)


def _load(request: LoadRequest) -> tuple[Any, Any]:
    """The script as a module and its decorated function; or, for a script that calls `autofit.start`,
    no module and the script itself as the function (run as far as its start call here)."""
    if request.function is None and calls_start(request.script):
        entry = ScriptEntry(request.script, script_args_from_env())
        entry.load()
        return None, entry
    if request.function is None and not may_define_autofit(request.script):
        raise UsageError(no_function_message(request.script, unread=True))  # before its training runs at import
    module = load_script(request.script)
    return module, find_function(module, request.function, request.script)


def prepare_process(*, follow_parent: bool = False) -> None:
    """A segfault in the user's code leaves a stack in the output (faulthandler). `follow_parent`:
    this process is killed when its parent dies and ignores Ctrl-C (the supervisor decides when
    it stops; a supervisor SIGKILLed or OOM-killed takes it along)."""
    faulthandler.enable()
    if follow_parent:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        die_with_parent()


def die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that started it ends (PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def redirect_output(path: str | None) -> None:
    """Point fd 1 and 2 at `path` (append), so the user's output lands in the probe's log."""
    sys.stdout.flush()
    sys.stderr.flush()
    target = os.open(path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)


def serve(channel: Channel, handlers: dict[str, Handler],
          before: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Answer requests until the supervisor says `exit` or goes away. Each request's `op` names its
    handler; whatever a handler raises becomes a failure reply, never the end of the process."""
    while True:
        message = channel.receive()
        if message is None or message["op"] == "exit":
            return 0
        if before is not None:
            before(message)
        try:
            reply = handlers[message["op"]](message)
        except UsageError as exc:
            reply = failure_reply("usage", str(exc))
        except ScriptError as exc:
            reply = failure_reply("script", exc.message, exc.traceback)
        except BaseException as exc:  # noqa: BLE001 - report, never die silently
            reply = internal_failure(exc)
        sys.stdout.flush()
        sys.stderr.flush()
        channel.send(reply)
