"""The worker's side: keeps torch and the user's module loaded, runs one probe per request.

Started by `autofit.probing._worker.Worker` as `python -m autofit.probing._worker_process FD`; FD is a socket to the
supervisor. The user's prints go to the log file named in each request, never into the protocol.

On CPU every probe runs in a fresh child forked from this warm process (torch and the user's module
already imported): the child starts from the same memory state as the user's own run, with glibc's
allocator untuned and fresh, so its speed and its peak are the real run's, and all of its memory
goes back when it exits. A long-lived process cannot promise either: glibc's heap keeps the history
of earlier probes (a fixed mmap threshold made memory return but cost ~30% on allocation-heavy
steps). The warm process runs with one intra-op thread until it forks, because GNU OpenMP hangs in a
child forked from a process whose thread team exists; the child sets the thread count back.
On CUDA the probe runs in this process (a CUDA context cannot be forked) and the caching allocator
is emptied between probes.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from autofit.errors import UsageError


class _Session:
    def __init__(self) -> None:
        self.fn: Any = None
        self.backend: Any = None

    def load(self, msg: dict) -> dict:
        started = time.perf_counter()
        import torch

        from autofit.devices import make_backend
        from autofit.probing._script import find_function, load_script

        self.backend = make_backend(msg["device"], msg.get("index", 0))
        torch_device = self.backend.torch_device()
        self.fork_probes = self.backend.type == "cpu"
        if self.fork_probes:
            self.threads = torch.get_num_threads()  # what the user's own run would get
            torch.set_num_threads(1)  # no OpenMP team in the process that forks (see the docstring)
        try:
            module = load_script(msg["script"])
        except UsageError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the user's module failed at import
            return {
                "ok": False,
                "kind": "script",
                "message": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
        self.fn = find_function(module, msg.get("function"), msg["script"])
        if self.fork_probes and torch.get_num_threads() != 1:
            self.threads = torch.get_num_threads()  # the script chose its own thread count at import
            torch.set_num_threads(1)
        self.backend.release()
        self.backend.apply_memory_limit(msg.get("memory_limit"), msg.get("usable_bytes"))
        options = getattr(self.fn, "options", None)
        return {
            "ok": True,
            "function": getattr(self.fn, "__name__", msg.get("function")),
            "options": options.__dict__ if options is not None else None,
            "device": self.backend.info().to_dict(),
            "torch_device": str(torch_device),
            "precisions": list(self.backend.supported_precisions()),
            "default_precisions": list(self.backend.default_precisions()),
            "baseline_bytes": self.backend.used_bytes(),
            "limit_bytes": self.backend.limit_bytes,
            "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
            "load_s": time.perf_counter() - started,
            "pid": os.getpid(),
        }

    def probe(self, msg: dict) -> dict:
        if getattr(self, "fork_probes", False):
            return self._probe_in_child(msg)
        return {"ok": True, "result": self._run_probe(msg).to_dict()}

    def _run_probe(self, msg: dict):
        from autofit.config import Config
        from autofit.probing._probe import run_probe

        return run_probe(
            self.fn,
            Config.from_dict(msg["config"]),
            self.backend,
            warmup_steps=msg.get("warmup", 2),
            measured_steps=msg.get("steps", 5),
            **({"min_measure_s": msg["min_measure_s"]} if msg.get("min_measure_s") is not None else {}),
        )

    def _probe_in_child(self, msg: dict) -> dict:
        """Fork a fresh child for the probe; its result comes back through a pipe."""
        import torch

        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: run the probe, send the result, leave without cleanup
            code = 0
            try:
                _die_with_parent()
                os.close(read_end)
                torch.set_num_threads(self.threads)
                reply = {"ok": True, "result": self._run_probe(msg).to_dict()}
            except BaseException as exc:  # noqa: BLE001 - reported to the supervisor, never raised
                reply = {"ok": False, "kind": "internal", "message": f"{type(exc).__name__}: {exc}",
                         "traceback": traceback.format_exc()}
                code = 1
            try:
                sys.stdout.flush()
                sys.stderr.flush()
                with os.fdopen(write_end, "wb") as pipe:
                    pickle.dump(reply, pipe)
            finally:
                os._exit(code)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        if data:
            reply = pickle.loads(data)
            if reply.get("ok"):
                reply["result"]["memory_after_bytes"] = self.backend.used_bytes()  # the child's memory is gone
            return reply
        return self._child_died(msg, status)

    def _child_died(self, msg: dict, status: int) -> dict:
        """The probe's process died before it could answer: a crash of the user's code."""
        from autofit.config import Config
        from autofit.probing._record import ProbeResult

        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            try:
                how = f"killed by {signal.Signals(number).name}"
            except ValueError:
                how = f"killed by signal {number}"
        else:
            how = f"exit status {os.WEXITSTATUS(status)}"
        result = ProbeResult(
            status="crashed", config=Config.from_dict(msg["config"]), limit_bytes=self.backend.limit_bytes,
            error_type="WorkerCrashed",
            error_message=f"The probe's process died ({how}); the next probe starts in a fresh one.",
            memory_after_bytes=self.backend.used_bytes(),
        )
        return {"ok": True, "result": result.to_dict()}


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the worker that forked it dies (no orphaned probes)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _redirect_output(path: str | None) -> None:
    """Point fd 1 and 2 at `path` (append), so the user's output lands in the probe's log."""
    sys.stdout.flush()
    sys.stderr.flush()
    target = os.open(path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when a worker stops
    _die_with_parent()  # a searcher that is SIGKILLed (or OOM-killed) takes its worker with it
    faulthandler.enable()  # a segfault in user code leaves a stack in the probe log
    conn = Connection(int(argv[1]))
    session = _Session()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return 0
        if msg["op"] == "exit":
            return 0
        _redirect_output(msg.get("log_path"))
        try:
            handler = session.load if msg["op"] == "load" else session.probe
            reply = handler(msg)
        except UsageError as exc:
            reply = {"ok": False, "kind": "usage", "message": str(exc)}
        except BaseException as exc:  # noqa: BLE001 - report, never die silently
            reply = {"ok": False, "kind": "internal", "message": f"{type(exc).__name__}: {exc}",
                     "traceback": traceback.format_exc()}
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send(reply)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
