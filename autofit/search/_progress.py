"""How a search reports progress: plain lines by default; the CLI may show a live display."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from autofit.study import DATA_BOUND_ERRORS
from autofit.units import format_duration, format_size

if TYPE_CHECKING:
    from autofit.config import Config
    from autofit.planner import SearchSpace
    from autofit.probing import ProbeResult


class Reporter:
    """Plain log lines, one per event (safe for files, CI logs and pipes)."""

    def __init__(self, stream: TextIO | None = None, quiet: bool = False, verbose: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.verbose = verbose
        self.search = None
        self.counts = {"probes": 0, "oom": 0, "failed": 0}
        self.best: tuple[float, str] | None = None

    def _line(self, text: str) -> None:
        if not self.quiet:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """The search is over (or interrupted): release the display."""

    def started(self, search, space: SearchSpace, existing: int) -> None:
        self.search = search
        session = search.session
        resumed = f", resuming {existing} earlier trials" if existing else ""
        self._line(
            f"search {session.study_name} on {session.device_info.type}:{session.device_info.index} "
            f"({session.device_info.name}), limit {format_size(session.memory_budget.limit_bytes)}, usable {format_size(session.memory_budget.usable_bytes)}, "
            f"budget {format_duration(search.s.budget_s)}{resumed}"
        )
        if self.verbose:
            self._line(f"space: {space.to_dict()}")

    def note(self, text: str) -> None:
        """Something the search did between probes (the memory estimator)."""
        self._line(text)

    def _left(self) -> str:
        return format_duration(max(0.0, self.search.time_budget.left())) if self.search else "?"

    def probe_started(self, number: int, config: Config, phase: str) -> None:
        if self.verbose:
            self._line(f"  trial {number} {phase}: {config.label()} ...")

    def probe_finished(self, number: int, result: ProbeResult, usable: float, where: str | None = None) -> None:
        """`where`: the worker it ran on, when a search has several."""
        self.counts["probes"] += 1
        if result.status == "oom" or (result.ok and (result.peak_bytes or 0) > usable):
            self.counts["oom"] += 1
        elif not result.ok and result.error_type not in DATA_BOUND_ERRORS:  # a data ceiling is no failure
            self.counts["failed"] += 1
        elif result.rate and (self.best is None or result.rate > self.best[0]):
            self.best = (result.rate, f"{result.config.label()} {result.rate:,.1f} {result.config.ranked_by.unit}")
        best = f"best {self.best[1]}" if self.best else "no fit yet"
        self._line(
            f"[{self.counts['probes']:>3} probes, {self.counts['oom']} too big, {self.counts['failed']} failed, "
            f"{self._left()} left, {best}] trial {number}{f' ({where})' if where else ''}: {result.summary()}"
        )


class LiveReporter(Reporter):
    """On a terminal: finished probes scroll as lines; a status line below them is redrawn twice a
    second with the running probe, the counts, the best so far and a bar for the budget."""

    _BAR = 24

    def __init__(self, stream: TextIO | None = None, verbose: bool = False) -> None:
        super().__init__(stream=stream, quiet=False, verbose=verbose)
        self._running: str | None = None
        self._since = 0.0
        self._stop = None
        self._lock = None

    def _status(self) -> str:
        import time

        if self.search is None:
            return ""
        total = self.search.s.budget_s
        left = max(0.0, self.search.time_budget.left())
        filled = int(self._BAR * (1 - left / total)) if total else self._BAR
        bar = "#" * filled + "-" * (self._BAR - filled)
        best = f"best {self.best[1]}" if self.best else "no fit yet"
        running = f"probing {self._running} ({time.monotonic() - self._since:.0f}s)" if self._running else "planning"
        c = self.counts
        return (f"[{bar}] {format_duration(left)} left | {c['probes']} probes, {c['oom']} too big, "
                f"{c['failed']} failed | {best} | {running}")

    def _draw(self) -> None:
        with self._lock:
            self.stream.write("\r\x1b[2K" + self._status()[: 200])
            self.stream.flush()

    def _line(self, text: str) -> None:
        import threading

        if self._lock is None:
            self._lock = threading.Lock()
        with self._lock:
            self.stream.write("\r\x1b[2K" + text + "\n")
            self.stream.flush()

    def started(self, search, space, existing: int) -> None:
        import threading

        super().started(search, space, existing)
        self._stop = threading.Event()

        def tick() -> None:
            while not self._stop.wait(0.5):
                self._draw()

        threading.Thread(target=tick, daemon=True).start()

    def probe_started(self, number: int, config, phase: str) -> None:
        import time

        self._running = f"trial {number} {config.label()}" + (f" ({phase})" if phase != "explore" else "")
        self._since = time.monotonic()
        super().probe_started(number, config, phase)

    def probe_finished(self, number: int, result, usable: float, where: str | None = None) -> None:
        self._running = None
        super().probe_finished(number, result, usable, where)

    def close(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._lock is not None:
            with self._lock:
                self.stream.write("\r\x1b[2K")
                self.stream.flush()
