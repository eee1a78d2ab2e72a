"""Token sequences of given lengths and the collate that pads them, for the tests of batching by tokens
(`run.token_batches`): inputs and next-token targets, padding marked PAD in the targets."""

from __future__ import annotations

import torch

PAD = -100


class Sequences(torch.utils.data.Dataset):
    """Token sequences of the given lengths (ids below 7), the same for a given list of lengths."""

    def __init__(self, lengths: list[int]) -> None:
        generator = torch.Generator().manual_seed(0)
        self.items = [torch.randint(0, 7, (n,), generator=generator) for n in lengths]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.items[index]


def collate(items: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch padded to its longest sample: inputs padded with 0, targets with PAD."""
    longest = max(len(t) for t in items)
    x = torch.zeros(len(items), longest, dtype=torch.long)
    y = torch.full((len(items), longest), PAD)
    for row, t in enumerate(items):
        x[row, :len(t)], y[row, :len(t)] = t, t
    return x, y
