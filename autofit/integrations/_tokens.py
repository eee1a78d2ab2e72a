"""Token batches in a framework's own DataLoader: the batch sampler of `run.token_batches`, its batches'
samples and real tokens handed to the framework's training step in the order the loader yields them."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from torch.utils.data import Sampler

from autofit.runtime import TokenBatchSampler


class CountedTokenBatches(Sampler[list[int]]):
    """A TokenBatchSampler for a framework's DataLoader that notes each batch it hands out (its samples and
    real tokens) until the training step takes it (`take()`), oldest first: a DataLoader yields its batch
    sampler's batches in order, however far ahead it loads (workers, Accelerate's one batch ahead).
    `endless` (a probe): the next epoch follows the last, so a probe never runs out of data; the length is
    one epoch's, so the script's own step arithmetic stays as it is."""

    def __init__(self, sampler: TokenBatchSampler, *, endless: bool = False) -> None:
        self.sampler = sampler
        """Named so: Accelerate's DataLoaderShard.set_epoch reaches `batch_sampler.batch_sampler.sampler`."""
        self.endless = endless
        self._handed_out: deque[tuple[int, int]] = deque()

    @property
    def max_tokens(self) -> int:
        return self.sampler.max_tokens

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        self._handed_out.clear()  # a new pass: what an abandoned one loaded ahead is never trained on
        lengths = self.sampler.lengths
        while True:
            for batch in self.sampler:
                self._handed_out.append((len(batch), sum(lengths[i] for i in batch)))
                yield batch
            if not self.endless:
                return
            self.sampler.set_epoch(self.sampler.epoch + 1)

    def __len__(self) -> int:
        return len(self.sampler)

    def take(self) -> tuple[int, int]:
        """The samples and real tokens of the oldest batch handed out and not yet taken ((0, 0): none)."""
        return self._handed_out.popleft() if self._handed_out else (0, 0)


def unshard_token_batches(loader: Any) -> Any:
    """`loader` as `accelerator.prepare` returned it, its token batches kept: across processes Accelerate
    wraps the batch sampler in a BatchSamplerShard that deals its batches out again, but token batches are
    dealt across the ranks already (every rank as many, none dropped), so the wrapper passes them through
    (as transformers' Trainer does for its own rank-aware BatchRebalanceSampler)."""
    shard = getattr(loader, "batch_sampler", None)
    if shard is not None and isinstance(getattr(shard, "batch_sampler", None), CountedTokenBatches):
        shard.num_processes, shard.process_index = 1, 0
    return loader
