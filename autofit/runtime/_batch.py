"""A loader's batch, whatever its nesting: one walk over tensors inside tuples, lists, namedtuples
and dicts, and what the run builds on it (moving to the device, counting samples, cutting into
micro-batches). Values that are not tensors (strings, ints, None) travel along unchanged."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch


def map_batch(batch: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """`batch` rebuilt with `fn` applied to each of its tensors, every container keeping its type
    (a namedtuple stays one, a dict subclass such as HF's BatchEncoding too)."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return type(batch)({key: map_batch(value, fn) for key, value in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple takes its fields by position
        return type(batch)(*(map_batch(value, fn) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_batch(value, fn) for value in batch)
    return batch


def batch_tensors(batch: Any) -> Iterator[torch.Tensor]:
    """The tensors of `batch`, depth first, in the order `map_batch` visits them."""
    if isinstance(batch, torch.Tensor):
        yield batch
        return
    if isinstance(batch, Mapping):
        values: Any = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        return
    for value in values:
        yield from batch_tensors(value)


def batch_len(batch: Any) -> int | None:
    """Samples in `batch`: the first dimension of its first tensor that has one; None without one."""
    return next((int(tensor.shape[0]) for tensor in batch_tensors(batch) if tensor.dim() > 0), None)


def count_samples(batch: Any) -> int:
    """Samples in a batch, for throughput: as `batch_len`, and 1 for a batch without a dimension to count."""
    found = batch_len(batch)
    return 1 if found is None else found


def to_device(batch: Any, device: torch.device) -> Any:
    """Move tensors, and tensors inside tuples, lists and dicts, to `device`."""
    return map_batch(batch, lambda tensor: tensor.to(device, non_blocking=True))


def split_batch(batch: Any, size: int) -> list[Any]:
    """`batch` cut into micro-batches of `size` samples along dim 0 (views, no copy).

    Every tensor with a first dimension is cut alike; scalar tensors and other values are given to
    every piece unchanged. A batch of at most `size` samples is returned whole.
    """
    count = batch_len(batch)
    if count is None or count <= size:
        return [batch]
    return [map_batch(batch, lambda tensor, start=start: tensor[start:start + size] if tensor.dim() > 0 else tensor)
            for start in range(0, count, size)]


def mark_shape_dynamic(batch: Any, samples: int, width: int) -> Any:
    """`batch` with the samples and length dimensions of each of its tensors shaped (samples, width, ...) marked
    dynamic for torch.compile (`torch._dynamo.maybe_mark_dynamic`: no error where the model specializes one), so
    that a compiled model over variable lengths compiles one graph for every shape at its first batch, where it
    would compile one for the first shape and another, dynamic, at the second (benchmarks/token-compile-cpu.md)."""
    import torch._dynamo

    for tensor in batch_tensors(batch):
        if tensor.dim() >= 2 and tuple(tensor.shape[:2]) == (samples, width):
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
            torch._dynamo.maybe_mark_dynamic(tensor, 1)
    return batch
