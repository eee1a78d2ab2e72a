"""The worker's side: keeps torch and the user's module loaded, runs one probe per request.

Started by `autofit.worker.Worker` as `python -m autofit._worker_process FD`; FD is a socket to the
supervisor. The user's prints go to the log file named in each request, never into the protocol.
"""

from __future__ import annotations

import faulthandler
import os
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
        from autofit.discover import find_function, load_script

        self.backend = make_backend(msg["device"], msg.get("index", 0))
        torch_device = self.backend.torch_device()
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
        self.backend.release()
        self.backend.apply_memory_limit(msg.get("memory_limit"))
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
        from autofit.probe import run_probe
        from autofit.space import Config

        result = run_probe(
            self.fn,
            Config.from_dict(msg["config"]),
            self.backend,
            warmup_steps=msg.get("warmup", 2),
            measured_steps=msg.get("steps", 5),
        )
        return {"ok": True, "result": result.to_dict()}


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
