"""`@autofit`: marks a train function for search, and runs it with the best config when called."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autofit.config import MAX_BATCH, PRECISIONS, Config
from autofit.options import SearchOptions

if TYPE_CHECKING:
    from autofit.run import Run

#: Steps a normal run leaves out of its reported throughput (a probe's default warm-up).
_NORMAL_RUN_WARMUP = 2


class AutofitFunction:
    """A train function marked for search. Called normally, it trains with the best config."""

    __autofit__ = True

    def __init__(self, fn: Callable[..., Any], options: SearchOptions) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.options = options

    def __repr__(self) -> str:
        return f"<autofit function {self.fn.__module__}.{self.fn.__qualname__}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from autofit.run import Run

        if args and isinstance(args[0], Run):  # a probe, or a caller who built the Run
            return self.fn(*args, **kwargs)
        run = self.make_run(config_path=kwargs.pop("autofit_config", None))
        with run.active():
            result = self.fn(run, *args, **kwargs)
        run.finish()
        run.report()
        return result

    def make_run(self, config_path: str | os.PathLike | None = None, device: str | None = None) -> Run:
        """The Run a normal call trains with: the best exported config if there is one."""
        from autofit.launch import resolve_run_config
        from autofit.run import Run

        config, device_name, message = resolve_run_config(self, config_path, device)
        print(f"autofit: {message}", file=sys.stderr)
        # The same warm-up a probe skips is left out of the run's own throughput figure.
        return Run(config, device_name, probing=False, warmup_steps=_NORMAL_RUN_WARMUP)

    def search(self, **kwargs: Any):
        """Search this function's best config from Python; see `autofit.search.run_search`."""
        from autofit.search import search_function

        return search_function(self, **kwargs)


def autofit(
    fn: Callable[..., Any] | None = None,
    *,
    global_batch: int | None = None,
    batch_size: tuple[int, int] = (1, MAX_BATCH),
    precision: tuple[str, ...] | list[str] | str | None = None,
    accumulation: tuple[int, ...] | list[int] | None = None,
    checkpoint: bool = True,
    default_batch_size: int = 32,
) -> Any:
    """Mark a train function `train(run)` for search: `@autofit` or `@autofit(global_batch=256)`."""
    if isinstance(precision, str):
        precision = (precision,)
    options = SearchOptions(
        global_batch=global_batch,
        batch_size=tuple(batch_size),
        precision=tuple(precision) if precision is not None else None,
        accumulation=tuple(accumulation) if accumulation is not None else None,
        checkpoint=checkpoint,
        default_batch_size=default_batch_size,
    )

    def decorate(f: Callable[..., Any]) -> AutofitFunction:
        return AutofitFunction(f, options)

    return decorate(fn) if fn is not None else decorate


__all__ = ["autofit", "AutofitFunction", "SearchOptions", "Config", "PRECISIONS"]
