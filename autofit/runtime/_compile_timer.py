"""How long torch.compile compiled while a probe ran, whoever asked for it: `run.compile` or the script's
own `torch.compile` (nanoGPT compiles its model itself, and its first evaluation compiles before any
training step). Timed by TorchDynamo's own compile start and end callbacks, which also cover the backward
graph compiled lazily at the first backward pass, so a probe line can say what compilation cost apart from
the steps it measured."""

from __future__ import annotations

import sys
import time
from typing import Any

import torch


class CompileTimer:
    """Sums the seconds TorchDynamo spent compiling while the block ran, and how much of it came before
    `before()` turned False (the run's first micro-batch ended). TorchDynamo is imported by the first
    `torch.compile` call: the callbacks are registered then (torch.compile is wrapped for the block),
    or at once when it is loaded already. Nothing is counted on a torch without the callbacks."""

    def __init__(self, before: Any = lambda: False) -> None:
        self._before = before
        self.total_s = 0.0
        self.before_first_s = 0.0
        self.compiles = 0
        self.cache_hits = 0
        """Graphs the compiler took from its caches while the block ran (inductor's FX graph cache and
        AOTAutograd's, on disk: they outlive a process, and TorchDynamo's reset between probes)."""
        self._hits_before = 0
        self._since: float | None = None
        self._handler: Any = None
        self._compile: Any = None
        self.timed = False
        """Whether compilation could be watched (TorchDynamo loaded, with its callbacks)."""

    def __enter__(self) -> CompileTimer:
        if "torch._dynamo" in sys.modules:
            self._register()
        else:
            self._compile = original = torch.compile

            def compile_then_register(*args: Any, **kwargs: Any) -> Any:
                compiled = original(*args, **kwargs)  # imports TorchDynamo
                self._register()
                return compiled

            torch.compile = compile_then_register
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handler is not None:
            self.cache_hits = _cache_hits() - self._hits_before
        if self._compile is not None:
            torch.compile = self._compile
            self._compile = None
        handler, self._handler = self._handler, None
        if handler is not None:
            for remove, callback in ((handler.remove_start_callback, self._started),
                                     (handler.remove_end_callback, self._ended)):
                try:
                    remove(callback)
                except ValueError:  # already gone (torch.compiler.reset() clears them)
                    pass

    def _register(self) -> None:
        if self._handler is not None:
            return
        handler = getattr(sys.modules.get("torch._dynamo"), "callback_handler", None)
        if handler is None or not hasattr(handler, "register_start_callback"):
            return
        handler.register_start_callback(self._started)
        handler.register_end_callback(self._ended)
        self._handler, self.timed = handler, True
        self._hits_before = _cache_hits()

    def _started(self, *args: Any) -> None:
        self._since = time.perf_counter()

    def _ended(self, *args: Any) -> None:
        if self._since is None:
            return
        spent = time.perf_counter() - self._since
        self._since = None
        self.total_s += spent
        self.compiles += 1
        if self._before():
            self.before_first_s += spent


def _cache_hits() -> int:
    """Graphs served from the compiler's caches in this process so far (TorchDynamo's counters)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return 0
    return sum(counters.get(group, {}).get(name, 0) for group, name in
               (("inductor", "fxgraph_cache_hit"), ("aot_autograd", "autograd_cache_hit")))
