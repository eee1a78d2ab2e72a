"""The `Run` of a script without a function: the process that executes the script (a probe's worker, the
memory estimator) hands its Run here first, and the script's `autofit.start(...)` takes it.

One script, one `autofit.start`: a second call is an error. While a worker loads the script, `start`
raises `StartReached` instead: the script's top ran as far as its start call, whose arguments the
search needs, and nothing trains at load."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from autofit.errors import UsageError

_LOADING = object()  # offered while the script loads: `start` answers with StartReached


class StartReached(BaseException):
    """Out of `autofit.start` while a worker loads a script (past any `except Exception` of it)."""

    def __init__(self, options: Any) -> None:
        super().__init__("autofit.start reached while loading the script")
        self.options = options


class _Slot:
    """What this process offers the script's one `autofit.start` call."""

    offered: Any = None
    taken: bool = False


_SLOT = _Slot()

ONE_START = ("A script must call autofit.start once, but it called it a second time: keep the one call "
             "at module level and pass its `run` to what needs it.")


@contextmanager
def offer_script_run(run: Any) -> Iterator[None]:
    """While the script runs, `autofit.start` returns `run` (a probe's, the estimator's); `None`:
    the script is loading, and `start` raises `StartReached`. Nothing is left for the next run."""
    _SLOT.offered, _SLOT.taken = (_LOADING if run is None else run), False
    try:
        yield
    finally:
        _SLOT.offered, _SLOT.taken = None, False


def take_script_run(options: Any) -> Any:
    """The Run offered to this script, or None when none is (a normal run builds its own)."""
    if _SLOT.offered is None:
        return None
    if _SLOT.offered is _LOADING:
        raise StartReached(options)
    if _SLOT.taken:
        raise UsageError(ONE_START)
    _SLOT.taken = True
    return _SLOT.offered
