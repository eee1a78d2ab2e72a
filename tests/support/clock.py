"""A fake of `time.perf_counter` and `time.sleep` for code running in the test's own process: only sleeping
moves the clock on, so what a test measures is what its fakes slept, however fast the machine."""

from __future__ import annotations

import time


class FakeClock:
    """The clock autofit's step timing reads (`time.perf_counter`), moved on only by `time.sleep` and
    `advance_to` (a fake loader waiting for a batch)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def advance_to(self, when: float) -> None:
        self.now = max(self.now, when)

    def install(self, monkeypatch) -> FakeClock:
        """In place of the time module's own until the test ends (modules that call `time.perf_counter()`
        see it; those that imported the function by name do not)."""
        monkeypatch.setattr(time, "perf_counter", self.perf_counter)
        monkeypatch.setattr(time, "sleep", self.sleep)
        return self
