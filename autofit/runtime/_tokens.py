"""`TokenBatchSampler`: micro-batches of variable-length samples whose padded size (samples x the
longest length in the batch) stays within a token cap, so that memory follows the cap and not the
longest sample the data happens to hold.

Samples are sorted by length (ties in a seeded random order) and cut greedily into batches, then the
batches are shuffled: padding stays small without a fixed bucket grid, and an epoch's order is a
function of (seed, epoch) alone, so a resumed run takes the same batches (fairseq's `--max-tokens`
batching, written here for any dataset that states its lengths). A probe takes the same batches in an
order of its own: the caps' worst first, then the rest stratified by length (autofit.runtime._probe_order)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils.data import Sampler

from autofit.config import Config, front_corners, pareto_front
from autofit.errors import UsageError
from autofit.runtime._dataloader import TimedDataLoader, loader_arguments
from autofit.runtime._probe_order import paid_ahead, stratified

#: A probe's worst-first batches at most (the Pareto front of an epoch's batches is two or three long).
WORST_BATCHES = 4


@dataclass(frozen=True)
class TokenBatchStats:
    """What one epoch's batches hold: real tokens, padded tokens (what memory pays for), and the
    samples longer than the cap (each a batch of its own, over the cap)."""

    batches: int
    samples: int
    real_tokens: int
    padded_tokens: int
    longest: int
    over_cap: int

    @property
    def padding_share(self) -> float:
        """The share of the padded tokens that are padding."""
        return 1.0 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0

    def describe(self) -> str:
        over = f"; {self.over_cap} sample(s) longer than the cap, each alone" if self.over_cap else ""
        return (f"{self.batches} batches of {self.samples} samples, {self.padding_share:.1%} padding "
                f"(longest {self.longest} tokens){over}")


class TokenBatchSampler(Sampler[list[int]]):
    """Index batches for a DataLoader's `batch_sampler`: each batch's sample count times its longest
    length is at most `max_tokens` (a sample longer than the cap goes alone), and with `max_squares` its
    count times its longest² at most that (the long batches held by their attention's squares, the short
    ones by their tokens). With several ranks,
    every rank gets the same number of batches (the epoch's batches are dealt round-robin, the last
    ones repeated from the start where they do not divide), so no rank waits on another's extra step.

    `skip(n)` resumes an epoch after its first n batches (of this rank)."""

    def __init__(self, lengths: Sequence[int], max_tokens: int, *, shuffle: bool = True, seed: int = 0,
                 rank: int = 0, world_size: int = 1, max_samples: int | None = None,
                 worst_first: bool = False, worst_only: bool = False, max_squares: int | None = None,
                 pad_multiple: int | None = None, window: int = 0) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, but got {max_tokens}")
        if max_squares is not None and max_squares < 1:
            raise ValueError(f"max_squares must be at least 1, but got {max_squares}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not one of {world_size} ranks")
        self.lengths = [int(n) for n in lengths]
        if any(n < 1 for n in self.lengths):
            raise ValueError("every sample's length must be at least 1 token")
        self.max_tokens = int(max_tokens)
        self.max_squares = None if max_squares is None else int(max_squares)
        self.pad_multiple = int(pad_multiple or 1)
        """The multiple a batch's longest length is padded up to (the config's `pad_multiple`; 1: none): the caps
        count the padded length, as the collate pads it."""
        self.shuffle, self.seed = shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.max_samples = max_samples
        self.worst_first = worst_first
        """A probe's: the epoch's worst batches come first (`_worst`: those no other batch beats in both
        padded tokens and padded squares), so that the probe's peak memory is the data's worst case and a cap
        picked from it survives the long tail; the rest follow stratified by length (`stratified`), so that
        the few steps a probe measures stand for the epoch."""
        self.worst_only = worst_only
        """The memory estimator's: every batch is that worst one (`worst_batch`), as many as the epoch has,
        so that each estimated step holds the cap's worst case, not a draw."""
        self.window = window if world_size == 1 and not worst_only else 0
        """A probe's: the micro-batches it measures at least, whose new shapes are the epoch's share of its
        batches (`paid_ahead`: the others' shapes paid in the warm-up, after the worst batches); 0: as they come.
        One process only (each rank would pay ahead its own count, and the ranks must step together); never the
        memory estimator's (`worst_only`: every batch is the worst one)."""
        self.epoch = 0
        self._skip = 0

    def padded(self, length: int) -> int:
        """A batch's padded length when its longest sample has `length` tokens (up to the pad multiple)."""
        return -(-length // self.pad_multiple) * self.pad_multiple

    def set_epoch(self, epoch: int) -> None:
        """Each epoch its own order (as DistributedSampler's `set_epoch`)."""
        self.epoch, self._skip = epoch, 0

    def skip(self, batches: int) -> None:
        """Start this epoch after its first `batches` batches: a resumed run takes the rest."""
        self._skip = batches

    def all_batches(self) -> list[list[int]]:
        """Every batch of this epoch, before they are dealt to the ranks."""
        generator = self._generator()
        batches = self._cut(generator)
        worst = self._worst(batches)
        if self.worst_first:  # a probe's: the caps' worst batches, then the rest stratified by length
            rest = [batch for batch in batches if not any(batch is w for w in worst)]
            rest = stratified(rest, self._length_key, self.world_size, generator)
            return worst + self._ahead(worst, rest, batches) + rest
        if self.shuffle:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
        return batches

    def _ahead(self, worst: list[list[int]], rest: list[list[int]], batches: list[list[int]]) -> list[list[int]]:
        """The batches of a probe's window whose shapes its warm-up pays ahead (`paid_ahead`)."""
        if not self.window:
            return []
        rate = len({self.shape(b) for b in batches}) / len(batches)
        return paid_ahead(rest[:self.window], {self.shape(b) for b in worst}, rate, self.shape)

    def warm_batches(self) -> int:
        """A probe's batches before its window: the worst ones, and those that pay its shapes ahead (none: its
        warm-up runs as it would)."""
        generator = self._generator()
        batches = self._cut(generator)
        worst = self._worst(batches)
        rest = stratified([b for b in batches if not any(b is w for w in worst)], self._length_key, 1, generator)
        ahead = self._ahead(worst, rest, batches) if self.worst_first else []
        return len(worst) + len(ahead) if ahead else 0

    def _length_key(self, batch: list[int]) -> tuple[int, int]:
        return self.lengths[batch[0]], len(batch)  # cut longest first: its first sample is its longest

    def shape(self, batch: list[int]) -> tuple[int, int]:
        """The shape a batch runs at: its samples, and its padded length (cut longest first: its first
        sample is its longest)."""
        return len(batch), self.padded(self.lengths[batch[0]])

    def _worst(self, batches: list[list[int]]) -> list[list[int]]:
        """The batches whose memory is the epoch's worst, most padded squares first: those no other batch
        matches in both padded tokens and padded squares (`pareto_front`), whatever the model's mix of the two
        (a longest sample that the cap holds once is not always the worst: with a cap of 3072, two samples of
        1536 hold more tokens and more squares than one of 2048). At most WORST_BATCHES of them."""
        if not batches:
            return []
        measures = {id(b): (len(b) * self.padded(self.lengths[b[0]]), len(b) * self.padded(self.lengths[b[0]]) ** 2)
                    for b in batches}
        # The front's corners, most squares first: every other batch of the front is under the hull of these,
        # so the envelope of the probed ones holds it too (a normal run splits none of them).
        front = front_corners(pareto_front(measures.values()))
        if len(front) > WORST_BATCHES:  # its ends, and evenly between
            front = [front[round(i * (len(front) - 1) / (WORST_BATCHES - 1))] for i in range(WORST_BATCHES)]
        worst = []
        for point in front:
            worst.append(next(b for b in batches if measures[id(b)] == point and not any(b is w for w in worst)))
        return worst

    def worst_batch(self) -> list[int]:
        """The batch whose memory is the cap's worst: the data's longest samples, as many as the cap holds
        (each padded to the longest; an attention holds samples x longest² scores, the most at the longest)."""
        batches = self._cut(self._generator())
        return batches[0] if batches else []

    def _generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)

    def _cut(self, generator: torch.Generator) -> list[list[int]]:
        """This epoch's batches in length order, cut greedily from the longest sample down."""
        order = (torch.randperm(len(self.lengths), generator=generator).tolist() if self.shuffle
                 else list(range(len(self.lengths))))
        order.sort(key=lambda i: -self.lengths[i])  # stable: equal lengths keep their random order
        batches: list[list[int]] = []
        current: list[int] = []
        for index in order:  # longest first: a batch's first sample sets its padded length
            longest = self.padded(self.lengths[current[0]] if current else self.lengths[index])
            full = self.max_samples is not None and len(current) >= self.max_samples
            squares = self.max_squares is not None and (len(current) + 1) * longest**2 > self.max_squares
            if current and ((len(current) + 1) * longest > self.max_tokens or full or squares):
                batches.append(current)
                current = []
            current.append(index)
        if current:
            batches.append(current)
        return batches

    def _mine(self) -> list[list[int]]:
        batches = self.all_batches()
        if self.worst_only and batches:
            worst = self.worst_batch()  # cut once: each call sorts the whole data set
            batches = [list(worst) for _ in batches]
        if self.world_size > 1 and batches:
            short = -len(batches) % self.world_size
            batches = batches + [batches[i % len(batches)] for i in range(short)]
            batches = batches[self.rank::self.world_size]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        yield from self._mine()[self._skip:]

    def __len__(self) -> int:
        return max(0, len(self._mine()) - self._skip)

    def stats(self) -> TokenBatchStats:
        """This epoch's batches (all ranks'), counted: the same in a probe as in the run."""
        batches = self._cut(self._generator())
        padded = sum(len(b) * self.padded(max(self.lengths[i] for i in b)) for b in batches)
        return TokenBatchStats(
            batches=len(batches), samples=sum(len(b) for b in batches),
            real_tokens=sum(self.lengths[i] for b in batches for i in b), padded_tokens=padded,
            longest=max(self.lengths, default=0),
            over_cap=sum(1 for n in self.lengths if self.padded(n) > self.max_tokens))


class TokenLoader(TimedDataLoader):
    """The DataLoader `run.token_batches()` builds: its `batch_sampler` a TokenBatchSampler, and the lengths
    of the samples of the batch it yielded last in `batch_lengths`, in the batch's order (a collate_fn
    keeps its samples' order): `run.batches` counts their real (non-padding) tokens (and weighs each
    micro-batch's loss by them, under `global_tokens`), and checks the batch against the probes'
    envelope (TokenGuard).

    A DataLoader yields its sampler's batches in order (workers or not), and the sampler's order is a
    function of (seed, epoch, skip): walking it again beside the loader pairs each batch with its indices."""

    batch_sampler: TokenBatchSampler
    batch_lengths: tuple[int, ...] = ()
    weight_by_tokens: bool = False
    """Set under `global_tokens`: run.batches weighs each micro-batch's loss by its real tokens."""

    def __iter__(self):
        lengths = self.batch_sampler.lengths
        for indices, batch in zip(list(self.batch_sampler), super().__iter__(), strict=False):
            self.batch_lengths = tuple(lengths[i] for i in indices)
            yield batch

    @property
    def real_tokens(self) -> int:
        """The real (non-padding) tokens of the batch yielded last."""
        return sum(self.batch_lengths)

    @property
    def batch_width(self) -> int:
        """The length the batch yielded last is padded to (its longest, up to the pad multiple)."""
        return self.batch_sampler.padded(max(self.batch_lengths, default=0))

    def set_epoch(self, epoch: int) -> None:
        """Each epoch its own order: call it at each epoch's start (as a DistributedSampler's)."""
        self.batch_sampler.set_epoch(epoch)

    def skip(self, batches: int) -> None:
        """Resume this epoch after its first `batches` batches (this rank's)."""
        self.batch_sampler.skip(batches)

    def stats(self) -> TokenBatchStats:
        """This epoch's batches, all ranks', counted (the padding share among them)."""
        return self.batch_sampler.stats()

    def capped_by_the_data(self) -> bool:
        """The whole epoch is one batch that half the cap would hold: a larger cap runs the same batch."""
        stats = self.stats()
        return stats.batches == 1 and 2 * stats.padded_tokens <= self.batch_sampler.max_tokens


def token_sampler(lengths: Sequence[int], config: Config, *, shuffle: bool, seed: int, rank: int, world_size: int,
                  probing: bool = False, worst_only: bool = False, window: int = 0) -> TokenBatchSampler:
    """The TokenBatchSampler at the config's token cap (None: `batch_size` samples at the longest length, the
    worst micro-batch a fixed size would meet), squares cap and pad multiple; a probe's puts the caps' worst
    batches first, and pays ahead the shapes of its `window` (micro-batches) beyond the epoch's share."""
    cap = config.max_tokens if config.max_tokens is not None else config.batch_size * max(lengths, default=1)
    max_samples = config.batch_size if config.max_tokens is not None and config.batch_size < config.max_tokens else None
    return TokenBatchSampler(lengths, cap, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size,
                             max_samples=max_samples, worst_first=probing, worst_only=worst_only,
                             max_squares=config.max_squares, pad_multiple=config.pad_multiple,
                             window=window if probing else 0)


def build_token_loader(dataset: Any, lengths: Sequence[int], config: Config, *, collate_fn: Callable | None,
                       shuffle: bool, seed: int, rank: int, world_size: int,
                       probing: bool = False, worst_only: bool = False, window: int = 0) -> TokenLoader:
    """A TokenLoader over `dataset` with `token_sampler`'s batches, its loader fields from the config;
    `worst_only` (the memory estimator's): every batch the cap's worst (TokenBatchSampler.worst_batch)."""
    if len(lengths) != len(dataset):
        raise UsageError(f"run.token_batches needs one length per sample: the dataset has {len(dataset)} "
                         f"samples, but got {len(lengths)} lengths.")
    sampler = token_sampler(lengths, config, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size,
                            probing=probing, worst_only=worst_only, window=window)
    arguments = loader_arguments(config, {"collate_fn": collate_fn} if collate_fn is not None else {},
                                 probing=probing)
    arguments.pop("drop_last", None)  # a batch sampler decides the batches
    return TokenLoader(dataset, batch_sampler=sampler, **arguments)


def steps_accumulation(stats: TokenBatchStats, global_tokens: int, world_size: int) -> int:
    """Micro-batches per optimizer step (per rank) that hold about `global_tokens` real tokens, all ranks
    together, at this epoch's mean real tokens per micro-batch: every rank counts the same batches, so
    all agree."""
    per_batch = stats.real_tokens / stats.batches if stats.batches else 1.0
    return max(1, round(global_tokens / (per_batch * world_size)))


def accumulate_tokens(loader: TokenLoader, config: Config, global_tokens: int | None, world_size: int,
                      notes: list[str]) -> Config:
    """Under `global_tokens`: the config at the accumulation that holds about that many tokens per step
    (`steps_accumulation`, said in `notes`), and the loader's micro-batches weighted by their tokens."""
    if global_tokens is None:
        return config
    loader.weight_by_tokens = True
    return config_for_tokens(loader.batch_sampler, config, global_tokens, world_size, notes)


def config_for_tokens(sampler: TokenBatchSampler, config: Config, global_tokens: int | None, world_size: int,
                      notes: list[str]) -> Config:
    """The config at the accumulation that holds about `global_tokens` real tokens per step over `sampler`'s
    batches (`steps_accumulation`, said in `notes`); `config` itself without `global_tokens`."""
    if global_tokens is None:
        return config
    accumulation = steps_accumulation(sampler.stats(), global_tokens, world_size)
    if accumulation == config.accumulation_steps:
        return config
    notes.append(f"accumulation {accumulation}: about {global_tokens} tokens per optimizer step")
    return replace(config, accumulation_steps=accumulation)
