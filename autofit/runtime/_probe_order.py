"""A probe's order of an epoch's token batches: stratified by length, so that the few batches a probe
measures stand for the whole epoch.

A probe times about five optimizer steps. Drawn at random from a long-tailed length distribution, five
batches can all be short or all be long, and where a token's cost grows with its sequence's length (an
attention's scores) the probe's tokens/s is then a draw's, not the epoch's: one token cap read 16k
tokens/s while its neighbours read 27-35k. Ordered here, any run of consecutive batches holds short,
typical and long ones in the epoch's proportions: a van der Corput (bit-reversal) sequence over the
batches sorted by length, started at a seeded random offset."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

T = TypeVar("T")


def stratified(batches: Sequence[T], length_of: Callable[[T], tuple[int, int]], ranks: int,
               generator: torch.Generator) -> list[T]:
    """`batches` in a probe's order: each rank's share (every `ranks`-th position, as the ranks are dealt
    them) stratified by `length_of` (a batch's sort key: its longest sample, then its size), and each
    share's sequence started at an offset of its own, so that one step's ranks hold unrelated lengths, as
    in a shuffled epoch (the step waits on its slowest rank). A permutation: every batch once."""
    ordered = sorted(batches, key=length_of)
    shares: list[list[T]] = [[] for _ in range(ranks)]
    for start in range(0, len(ordered), ranks):  # neighbours in length go to different ranks
        chunk = ordered[start:start + ranks]
        if len(chunk) == ranks:
            chunk = [chunk[i] for i in torch.randperm(ranks, generator=generator).tolist()]
        for rank, batch in enumerate(chunk):  # a last, short chunk: to the first ranks, as dealing does
            shares[rank].append(batch)
    orders = [_spread(share, generator) for share in shares]
    return [order[k] for k in range(len(orders[0])) for order in orders if k < len(order)]


def _spread(items: list[T], generator: torch.Generator) -> list[T]:
    """`items` (sorted) in a low-discrepancy order: the bit-reversal of 0, 1, 2, ... over the next power
    of two, shifted by a seeded offset and scaled to the items, each item at its first visit."""
    count = len(items)
    if count < 2:
        return list(items)
    size = 1 << (count - 1).bit_length()
    bits = size.bit_length() - 1
    offset = int(torch.randint(size, (1,), generator=generator))
    seen: set[int] = set()
    out: list[T] = []
    for k in range(size):
        position = ((_reversed(k, bits) + offset) % size) * count // size
        if position not in seen:
            seen.add(position)
            out.append(items[position])
    return out


def _reversed(value: int, bits: int) -> int:
    return int(format(value, f"0{bits}b")[::-1], 2) if bits else 0
