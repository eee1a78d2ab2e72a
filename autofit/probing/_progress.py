"""A running probe's sign of life, and the limits its runner kills it by.

A probe on a GPU pays for its start (the script's own set-up and evaluation, compilation) before its
first micro-batch ends, then for its steps. One fixed timeout over both killed nanoGPT's compiled probes
on an H100 while they compiled. So a probe writes what it has done (`ProgressFile`: micro-batches and
optimizer steps, at most once a second) where its runner looks, and the runner (`ProbeWatch`) kills it
only when its start takes longer than `ProbeLimits.start_s`, when its steps make no progress for
`stall_s`, or when it reaches `total_s` (the search's budget) whatever its progress. Each reason is its
own kind of result (`timeout_result`): a start or a stall is a timeout, the budget's end is no verdict on
the config at all.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass

#: A probe's progress is written at most this often (seconds): a sign of life, not a log.
_WRITE_EVERY_S = 1.0
#: How often a runner looks at a running probe's progress (seconds).
POLL_S = 0.5


@dataclass(frozen=True)
class ProbeLimits:
    """When a runner kills a probe: its start (until its first micro-batch ends) past `start_s`, its steps
    without progress for `stall_s`, or the whole of it past `total_s` (None: no such limit)."""

    start_s: float
    stall_s: float
    total_s: float | None = None

    @classmethod
    def of(cls, timeout: float | ProbeLimits) -> ProbeLimits:
        """A bare number of seconds limits the start and each stretch without progress alike."""
        return timeout if isinstance(timeout, ProbeLimits) else cls(float(timeout), float(timeout))

    @property
    def longest_s(self) -> float:
        """The longest a probe under these limits can take before its first sign of life."""
        return min(self.start_s, self.total_s) if self.total_s is not None else self.start_s

    def open_step_s(self, warmup: int, steps: int) -> float:
        """How long a probe follows a loop with a finite loss past the micro-batches it allows without an
        optimizer step (a loop's own accumulation: autofit.runtime's OpenStep): micro-batches are no progress
        once they close no step, so its stall limit; and no longer than leaves its `total_s` room for a step of
        that length for each of its warm-up and measured steps and one more."""
        if self.total_s is None:
            return self.stall_s
        return min(self.stall_s, self.total_s / (warmup + steps + 1))

    def to_wire(self) -> dict:
        return {"start_s": self.start_s, "stall_s": self.stall_s, "total_s": self.total_s}

    @classmethod
    def from_wire(cls, data: dict | float) -> ProbeLimits:
        if not isinstance(data, dict):
            return cls.of(data)
        return cls(float(data["start_s"]), float(data["stall_s"]),
                   None if data.get("total_s") is None else float(data["total_s"]))


class ProgressFile:
    """Called by the probe's run with (micro-batches done, optimizer steps done); writes them to `path`
    (replaced whole: a reader never sees half of it): the first at once, then at most once a second, and a
    thread writes the last one within a second of its coming (a probe that stalls right after some
    progress must not leave an older count behind). Use it as a context: the thread ends with it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._latest: tuple[int, int] | None = None
        self._written: tuple[int, int] | None = None
        self._written_at: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None

    def __enter__(self) -> ProgressFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None

    def __call__(self, micro_batches: int, steps: int) -> None:
        self._latest = (micro_batches, steps)
        now = time.monotonic()
        if self._written_at is None or now - self._written_at >= _WRITE_EVERY_S:
            self._write()
        if self._flusher is None and not self._stop.is_set():
            flusher = threading.Thread(target=self._flush, name="autofit-progress", daemon=True)
            try:
                flusher.start()
            except RuntimeError:  # no memory left for a thread (the probe ran out of it): the writes above go on
                self._stop.set()
                return
            self._flusher = flusher

    def _flush(self) -> None:
        while not self._stop.wait(_WRITE_EVERY_S):
            if self._latest != self._written:
                self._write()

    def _write(self) -> None:
        with self._lock:
            latest = self._latest
            if latest is None:
                return
            self._written, self._written_at = latest, time.monotonic()
            temporary = f"{self.path}.{os.getpid()}.tmp"
            try:
                with open(temporary, "w") as handle:
                    json.dump({"micro_batches": latest[0], "steps": latest[1]}, handle)
                os.replace(temporary, self.path)
            except OSError:  # a sign of life lost is no fault of the probe's
                pass


def read_progress(path: str | None) -> tuple[int, int] | None:
    """(micro-batches, steps) the probe wrote last, or None before its first micro-batch ended."""
    if not path:
        return None
    try:
        with open(path) as handle:
            data = json.load(handle)
        return int(data["micro_batches"]), int(data["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ProbeWatch:
    """One running probe, as its runner sees it: `expired()` says why it must be killed now, or None."""

    def __init__(self, limits: ProbeLimits, path: str | None) -> None:
        self.limits = limits
        self.path = path
        self.started = time.monotonic()
        self.progress: tuple[int, int] | None = None
        self._changed = self.started

    def expired(self) -> str | None:
        """"budget" (past `total_s`), "start" (no micro-batch done within `start_s`), "stall" (no
        progress for `stall_s` since the last), or None."""
        now = time.monotonic()
        seen = read_progress(self.path)
        if seen is not None and seen != self.progress:
            self.progress, self._changed = seen, now
        if self.limits.total_s is not None and now - self.started >= self.limits.total_s:
            return "budget"
        if self.progress is None:
            return "start" if now - self.started >= self.limits.start_s else None
        return "stall" if now - self._changed >= self.limits.stall_s else None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def wait_s(self) -> float:
        """How long a runner may wait for the probe's answer before it looks again."""
        return POLL_S


class ProgressFolder:
    """Where one runner's probes write their progress: a folder of its own (mkdtemp: private, a fresh name),
    made on first use and removed with `remove`."""

    def __init__(self) -> None:
        self._folder: str | None = None

    def fresh_path(self) -> str:
        """A place for the next probe's progress, with nothing of the last one's in it."""
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="autofit-progress-")
        path = os.path.join(self._folder, "probe.json")
        if os.path.exists(path):
            os.remove(path)
        return path

    def remove(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
