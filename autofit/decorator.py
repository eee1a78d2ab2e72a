"""`@autofit`: marks a train function for search, and runs it with the best config when called."""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autofit.config import PRECISIONS, Config
from autofit.options import SearchOptions, search_options

if TYPE_CHECKING:
    from autofit.devices import DeviceBackend
    from autofit.runtime import Lowering, Run, StepRedo

#: Steps a normal run leaves out of its reported throughput (a probe's default warm-up).
_NORMAL_RUN_WARMUP = 2


class AutofitFunction:
    """A train function marked for search. Called normally, it trains with the best config."""

    __autofit__ = True

    def __init__(self, fn: Callable[..., Any], options: SearchOptions) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.options = options
        #: The backend of each device a normal call ran on, kept for the process's lifetime: the memory
        #: limit it enforces is the process's, applied (and announced) once, not again at each attempt.
        self._backends: dict[tuple[str, int], DeviceBackend] = {}

    def __repr__(self) -> str:
        return f"<autofit function {self.fn.__module__}.{self.fn.__qualname__}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from autofit.normal_run import report_run
        from autofit.runtime import Run, record_lowerings

        if args and isinstance(args[0], Run):  # a probe, or a caller who built the Run
            return self.fn(*args, **kwargs)
        plan = self.plan_run(config_path=kwargs.pop("autofit_config", None))
        attempts = [self.make_run(plan=plan)]  # the Run of the attempt under way, last
        redo = attempts[-1].control.redo  # shared by every attempt: it keeps the lowerings of all of them
        world_size = attempts[-1].world_size

        def train(config: Config | None) -> Any:
            if config is not None:  # started again after an OOM before the first optimizer step
                attempts.append(self.make_run(plan=plan._replace(config=config, searched_world=world_size),
                                              redo=redo))
            with attempts[-1].control.active():
                return self.fn(attempts[-1], *args, **kwargs)

        def failed() -> Lowering | None:
            # An OOM before the first optimizer step: nothing was trained, so the function starts
            # again with the lowered config, in a new Run; the failed one goes now, so that its
            # memory (its optimizer, the model through it) is freed with the traceback's.
            lowering = attempts[-1].control.restart_lowering
            if lowering is not None:
                attempts.pop()
            return lowering

        try:
            result = redo.until_it_starts(train, failed)
            attempts[-1].finish()
            report_run(attempts[-1], plan.searched_threads)
            return result
        finally:
            if redo.lowerings:
                record_lowerings(plan.record_path, plan.config, redo.lowerings, plan.path)
            if world_size > 1:
                from autofit.runtime import leave_process_group

                leave_process_group()

    def plan_run(self, config_path: str | os.PathLike | None = None, device: str | None = None, say: bool = True):
        """What a normal call trains with (autofit.normal_run.RunPlan): the best exported config, if any,
        said in one line where `say`."""
        from autofit.normal_run import resolve_run_config

        return resolve_run_config(self, config_path, device, say=say)

    def make_run(self, config_path: str | os.PathLike | None = None, device: str | None = None,
                 *, plan: Any = None, redo: StepRedo | None = None) -> Run:
        """The Run a normal call trains with: the best exported config if there is one, recovering
        from OOM unless turned off, under $AUTOFIT_MEMORY_LIMIT when set. `redo`: the OOM-redo path
        of an earlier attempt of the same call, which this Run goes on with (None: a new one)."""
        import torch

        from autofit.devices import available_memory_bytes, make_backend
        from autofit.export import MemoryBudget
        from autofit.runtime import (
            Run,
            RunSettings,
            StepRedo,
            describe_memory_limit,
            memory_limit_from_env,
            per_rank_config,
            ranks_from_env,
            normal_run_recovers,
        )

        plan = plan or self.plan_run(config_path, device)
        ranks = ranks_from_env()
        recover = normal_run_recovers(self.options.recover_oom, ranks.world_size)
        torch_device = torch.device(plan.device)
        config, note = per_rank_config(plan.config, ranks.world_size, plan.searched_world)
        if ranks.world_size > 1:  # torchrun: each rank its own GPU, its share of the accumulation
            if torch_device.type == "cuda":
                torch_device = torch.device("cuda", ranks.local_rank)
            if ranks.is_main:
                print(f"autofit: {ranks.world_size} ranks, each {config.label()}"
                      f" (global batch {config.global_batch * ranks.world_size}); no OOM recovery across ranks"
                      + (f"; {note}" if note else ""), file=sys.stderr)
        elif note or config != plan.config:
            print(f"autofit: searched on {plan.searched_world} ranks, run as one process: {config.label()}"
                  + (f"; {note}" if note else ""), file=sys.stderr)
        key = (torch_device.type, torch_device.index or 0)
        backend = self._backends.get(key)
        if backend is None:
            backend = self._backends[key] = make_backend(*key)
        memory_limit = memory_limit_from_env(plan.searched_memory_limit)
        if memory_limit is not None and backend.memory_limit != memory_limit:
            backend.apply_memory_limit(MemoryBudget(limit_bytes=memory_limit))
            print(describe_memory_limit(memory_limit), file=sys.stderr)
        if redo is None:
            redo = StepRedo(enabled=recover, release_memory=backend.release, used_memory=backend.used_bytes)
        # The same warm-up a probe skips is left out of the run's own throughput figure.
        return Run(RunSettings(config, torch_device, probing=False, warmup_steps=_NORMAL_RUN_WARMUP,
                               defaults=plan.path is None, ranks=ranks, redo=redo,
                               global_tokens=self.options.global_tokens, token_envelope=plan.token_envelope,
                               alloc_retries=backend.alloc_retries, host_memory=available_memory_bytes))

    def search(self, **kwargs: Any):
        """Search this function's best config from Python; see `autofit.search.run_search`."""
        from autofit.search import search_function

        return search_function(self, **kwargs)


def autofit(fn: Callable[..., Any] | None = None, **declared: Any) -> Any:
    """Mark a train function `train(run)` for search: `@autofit` or `@autofit(global_batch=256)`.

    Takes the arguments of `search_options` (its signature is this one's too), declared there once:
    `global_tokens=N`: a function that batches by tokens (run.token_batches) keeps about N real tokens
    per optimizer step, whatever the micro-batch's cap.
    `batch_range=(lo, hi)`: the micro-batches to consider (default: 1 up, until memory stops the climb);
    `token_range=(lo, hi)` the token caps, for a function that batches by tokens.
    `default_batch_size=`, `default_precision=`: what a normal call trains with before any search (the
    script's own micro-batch and precision; a dtype's name such as nanoGPT's `"bfloat16"` is taken).
    `batch_size=` is its old name, still taken (deprecated)."""
    options = search_options(**declared)

    def decorate(f: Callable[..., Any]) -> AutofitFunction:
        return AutofitFunction(f, options)

    return decorate(fn) if fn is not None else decorate


autofit.__signature__ = inspect.signature(search_options).replace(  # type: ignore[attr-defined]
    parameters=[inspect.Parameter("fn", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                  annotation="Callable[..., Any] | None"),
                *inspect.signature(search_options).parameters.values()],
    return_annotation="Any")


__all__ = ["autofit", "search_options", "AutofitFunction", "SearchOptions", "Config", "PRECISIONS"]
