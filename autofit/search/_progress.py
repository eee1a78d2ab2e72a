"""How a search reports progress: plain lines by default; the CLI may show a live display."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from autofit.units import format_duration, format_size

if TYPE_CHECKING:
    from autofit.record import ProbeResult
    from autofit.search._space import SearchSpace
    from autofit.space import Config


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

    def started(self, search, space: SearchSpace, existing: int) -> None:
        self.search = search
        resumed = f", resuming {existing} earlier trials" if existing else ""
        self._line(
            f"search {search.study_name} on {search.device_info.type}:{search.device_info.index} "
            f"({search.device_info.name}), limit {format_size(search.limit)}, usable {format_size(search.usable)}, "
            f"budget {format_duration(search.s.budget_s)}{resumed}"
        )
        if self.verbose:
            self._line(f"space: {space.to_dict()}")

    def _left(self) -> str:
        return format_duration(max(0.0, self.search._budget_left())) if self.search else "?"

    def probe_started(self, number: int, config: Config, phase: str) -> None:
        if self.verbose:
            self._line(f"  trial {number} {phase}: {config.label()} ...")

    def probe_finished(self, number: int, result: ProbeResult, usable: float) -> None:
        self.counts["probes"] += 1
        if result.status == "oom" or (result.ok and (result.peak_bytes or 0) > usable):
            self.counts["oom"] += 1
        elif not result.ok:
            self.counts["failed"] += 1
        elif result.samples_per_s and (self.best is None or result.samples_per_s > self.best[0]):
            self.best = (result.samples_per_s, result.config.label())
        best = f"best {self.best[1]} {self.best[0]:,.1f}/s" if self.best else "no fit yet"
        self._line(
            f"[{self.counts['probes']:>3} probes, {self.counts['oom']} oom, {self.counts['failed']} failed, "
            f"{self._left()} left, {best}] trial {number}: {result.summary()}"
        )
