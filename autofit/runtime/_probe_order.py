"""A probe's order of an epoch's token batches: stratified by length, so that the few batches a probe
measures stand for the whole epoch, and its new shapes as many as the epoch's (`paid_ahead`).

A probe times about five optimizer steps. Drawn at random from a long-tailed length distribution, five
batches can all be short or all be long, and where a token's cost grows with its sequence's length (an
attention's scores) the probe's tokens/s is then a draw's, not the epoch's: one token cap read 16k
tokens/s while its neighbours read 27-35k. Ordered here, any run of consecutive batches holds short,
typical and long ones in the epoch's proportions: the batches sorted by length, cut into strata, and
the strata visited in van der Corput (bit-reversal) order from a seeded offset, scrambled (`_spread`).
Eight steps of a long-tailed set read the epoch's rate within 4% on average, 10% at worst, where shuffled
they erred by 12% and 38%; on two ranks 7% and 23%, against 9% and 37%
(tests/unit/runtime/test_token_batches.py)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

import torch

T = TypeVar("T")


def stratified(batches: Sequence[T], length_of: Callable[[T], tuple[int, int]], ranks: int,
               generator: torch.Generator) -> list[T]:
    """`batches` in a probe's order: each rank's share (every `ranks`-th position, as the ranks are dealt
    them) stratified by `length_of` (a batch's sort key: its longest sample, then its size), and each
    share's sequence started at an offset and scrambled by coins of its own, so that one step's ranks hold
    unrelated lengths, as in a shuffled epoch (the step waits on its slowest rank). A permutation: every
    batch once."""
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
    """`items` (sorted) in a low-discrepancy order. They are cut into 2^m strata of consecutive items (the
    largest power of two not above their count), and the strata visited in van der Corput order (the
    bit-reversal of a counter started at a seeded offset), one item of each per round in a seeded order.
    Any 2^j consecutive counts differ in their low j bits, so their reversals differ in their high j: any
    2^j consecutive batches of a round hold one of each of the 2^j coarsest strata."""
    count = len(items)
    if count < 2:
        return list(items)
    bits = count.bit_length() - 1
    strata_count = 1 << bits
    keys = torch.rand(count, generator=generator).tolist()
    strata = [sorted(range(s * count // strata_count, (s + 1) * count // strata_count), key=keys.__getitem__)
              for s in range(strata_count)]
    offset = int(torch.randint(strata_count, (1,), generator=generator))
    flips = torch.randint(2, (strata_count,), generator=generator).tolist()
    out: list[T] = []
    for round_ in range(max(len(stratum) for stratum in strata)):
        for k in range(strata_count):
            stratum = strata[_scrambled(_reversed((k + offset) % strata_count, bits), bits, flips)]
            if round_ < len(stratum):
                out.append(items[stratum[round_]])
    return out


def _scrambled(stratum: int, bits: int, flips: list[int]) -> int:
    """Owen's nested scramble of a stratum's index: each bit flipped or not by a seeded coin of the
    strata above it. Strata of distinct high bits stay so (the windows keep their strata), while two
    ranks' scrambles pair their strata at random: a shuffled epoch's ranks hold unrelated lengths in a
    step, and bare offsets would pair them by a pattern (a long batch always beside a short one)."""
    out, prefix = 0, 1
    for level in range(bits):
        bit = (stratum >> (bits - 1 - level)) & 1
        out = (out << 1) | (bit ^ flips[prefix])
        prefix = (prefix << 1) | bit
    return out


def _reversed(value: int, bits: int) -> int:
    return int(format(value, f"0{bits}b")[::-1], 2) if bits else 0


def paid_ahead(window: Sequence[T], paid: set, rate: float, shape_of: Callable[[T], Hashable]) -> list[T]:
    """The batches of a probe's `window` whose shapes its warm-up pays for ahead, so that the window meets a new
    shape (one no batch before it ran: `paid` holds those the warm-up runs anyway) as often as the epoch does:
    `rate` is the epoch's share of batches whose shape is new to it (its distinct shapes over its batches).

    A library that builds something per shape (cuDNN's attention graphs, oneDNN's primitives) makes a batch of a
    new shape slower than one it met before. A length-sorted epoch whose lengths are not padded to a multiple
    meets a new shape at almost every batch, and so do a probe's stratified batches; padded, an epoch of a
    hundred batches may hold twenty shapes, while a probe's few stratified batches are still mostly new, and it
    would read every multiple as slower than it runs. Walking the window, a batch whose shape is unpaid pays in
    the window while the window's new shapes stay within `rate` of its batches so far, else in the warm-up (its
    batch run there once more). `paid` is updated."""
    ahead: list[T] = []
    new = 0
    for position, batch in enumerate(window, start=1):
        shape = shape_of(batch)
        if shape in paid:
            continue
        paid.add(shape)
        if new + 1 <= rate * position + 0.5:
            new += 1
        else:
            ahead.append(batch)
    return ahead
