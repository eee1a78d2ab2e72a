"""The DataLoader `run.loader()` builds: the config's loader fields over what the script declares."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from autofit.config import Config

#: Config field -> the DataLoader argument it sets.
_ARGUMENTS = {"loader_workers": "num_workers", "pin_memory": "pin_memory", "prefetch_factor": "prefetch_factor"}


def loader_arguments(config: Config, declared: dict[str, Any], *, probing: bool = False) -> dict[str, Any]:
    """DataLoader keyword arguments: `declared` (the script's), with the config's loader fields on top.

    Arguments that need workers are dropped when there are none (DataLoader refuses them then), and
    a probe never keeps its workers alive between epochs (persistent_workers): each probe is a fresh
    run, and workers kept alive would outlive it.
    """
    arguments = dict(declared)
    for field, argument in _ARGUMENTS.items():
        value = getattr(config, field)
        if value is not None:
            arguments[argument] = value
    arguments.setdefault("drop_last", True)
    if not arguments.get("num_workers"):
        for argument in ("prefetch_factor", "persistent_workers"):
            arguments.pop(argument, None)
    if probing:
        arguments.pop("persistent_workers", None)
    return arguments


def build_loader(dataset: Any, config: Config, batch_size: int, sampler: torch.utils.data.Sampler | None,
                 declared: dict[str, Any], *, probing: bool = False) -> torch.utils.data.DataLoader:
    """The DataLoader over `dataset` with `batch_size` and `sampler`, as `loader_arguments` says."""
    arguments = loader_arguments(config, declared, probing=probing)
    if sampler is not None:
        arguments["sampler"] = sampler
        arguments.pop("shuffle", None)  # the sampler shuffles
    return TimedDataLoader(dataset, batch_size=batch_size, **arguments)


def prefetch_warmup(iterable: Any, accumulation_steps: int) -> tuple[int, str] | None:
    """The optimizer steps that empty a DataLoader's prefetch queue, to count as warm-up, and the note
    that says so; None for data without workers.

    A DataLoader's workers fill their queue (workers x prefetch_factor batches) while the first,
    slow steps run; measured from there, a short window would time the queue rather than the
    loading, and a deeper prefetch would "win" by its size. The same rule holds for a probe and a
    normal run, so their figures are measured alike."""
    workers = getattr(iterable, "num_workers", 0) if isinstance(iterable, torch.utils.data.DataLoader) else 0
    if not workers:
        return None
    depth = iterable.prefetch_factor or 2
    steps = math.ceil(workers * depth / accumulation_steps)
    return steps, (f"warm-up {steps} optimizer steps longer: the loader's prefetch queue "
                   f"({workers} workers x {depth} batches) drained before measuring")


def count_prefetch_as_warmup(iterable: Any, accumulation_steps: int, clock: Any, notes: list[str]) -> None:
    """Lengthen `clock`'s warm-up by the steps that empty `iterable`'s prefetch queue (`prefetch_warmup`),
    and say so in `notes`: the one rule for a loop autofit feeds and one it follows."""
    drained = prefetch_warmup(iterable, accumulation_steps)
    if drained is not None:
        clock.warmup_steps += drained[0]
        notes.append(drained[1])


class TimedDataLoader(torch.utils.data.DataLoader):
    """The DataLoader `run.loader()` builds: a DataLoader in every way, which also tells `waited` how
    long each `next()` took (the run counts it where a loop it follows is fetching)."""

    waited: Callable[[float], None] | None = None

    def __iter__(self):
        return _timed(super().__iter__(), self)


def _timed(iterator: Any, loader: TimedDataLoader):
    while True:
        started = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            return
        if loader.waited is not None:
            loader.waited(time.perf_counter() - started)
        yield batch
