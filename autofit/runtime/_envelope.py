"""`TokenEnvelope`: the micro-batches by tokens a search's probes ran, and `TokenGuard`: a normal run's
check that splits a micro-batch beyond them before it runs.

Under a token cap, a micro-batch's linear memory follows its padded tokens (samples x the longest in
it), which the cap bounds; an attention that is not fused holds samples x longest² scores per head and
layer, which the cap does not: a batch of a few samples longer than any the probes drew can need more
than any batch they measured. The probes' worst-first batch (their longest sample at the cap) bounds
every batch no longer than it to within one sample's squares; a longer one beyond their squares is the
batch the probes never saw."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from autofit.config import under_front, widest_envelope
from autofit.runtime._micro import MicroBatch


@dataclass(frozen=True)
class TokenEnvelope:
    """The largest of each measure over the micro-batches the probes ran (the best-config file's
    `measured.token_envelope`): their longest sample, padded tokens (samples x longest) and padded
    squares (samples x longest², what a non-fused attention holds per head and layer), and the Pareto front
    of those micro-batches in (padded tokens, padded squares): the batches no other ran matches in both.
    A micro-batch no larger in both than one of them needs no more memory than it did, whatever the model's
    mix of the two; one beyond every one of them is a batch the probes never ran."""

    longest_sample: int
    padded_tokens: int
    padded_squares: int
    front: tuple[tuple[int, int], ...] = ()
    """(padded tokens, padded squares) of the ran micro-batches no other ran beats in both; empty in files
    written before it was kept (then the measures alone decide, as they did)."""
    caches: dict[str, int] | None = None
    """The capacities of what libraries keep per shape that the probes ran under (autofit.runtime's
    `bound_shape_caches`, on the CPU): a normal run sets the same; None where none were bounded."""

    @classmethod
    def of_batch(cls, samples: int, longest: int, caches: dict[str, int] | None = None) -> TokenEnvelope:
        """One micro-batch of `samples` samples padded to `longest` tokens (under `caches`)."""
        return cls(longest, samples * longest, samples * longest**2, ((samples * longest, samples * longest**2),),
                   caches)

    def widened(self, other: TokenEnvelope | None) -> TokenEnvelope:
        """The envelope of both (each measure's largest, one front: `autofit.config.widest_envelope`)."""
        if other is None:
            return self
        return TokenEnvelope.from_dict(widest_envelope([self.to_dict(), other.to_dict()]))

    def holds(self, samples: int, longest: int) -> bool:
        """A micro-batch is inside when it is under the hull of the batches the probes ran in padded tokens and
        padded squares (`under_front`): no larger in both than one of them, or than a mix of two (its memory,
        a x tokens + b x squares, is then at most the worse one's). Without a front (an older file): unless
        its longest sample is longer than the probes' and its padded squares more than theirs."""
        tokens, squares = samples * longest, samples * longest**2
        if self.front:
            return under_front(self.front, tokens, squares)
        return longest <= self.longest_sample or squares <= self.padded_squares

    def piece_samples(self, samples: int, longest: int) -> int:
        """Samples per piece of a micro-batch beyond the envelope: as few pieces as keep each within a batch
        the probes ran (within their padded squares and tokens, without a front), as even as they divide (one
        sample at least: a sample is never cut)."""
        bounds = self.front or ((self.padded_tokens, self.padded_squares),)
        most = max(1, max(min(s // longest**2, t // longest) for t, s in bounds))
        pieces = -(-samples // most)
        return -(-samples // pieces)

    def describe(self) -> str:
        return (f"longest {self.longest_sample} tokens, {self.padded_tokens} padded tokens, "
                f"{self.padded_squares} padded squares")

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"longest_sample": self.longest_sample, "padded_tokens": self.padded_tokens,
                                "padded_squares": self.padded_squares}
        return {**data, **({"front": [list(p) for p in self.front]} if self.front else {}),
                **({"caches": dict(self.caches)} if self.caches else {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> TokenEnvelope | None:
        """An envelope from a file (None when it holds none)."""
        if not data:
            return None
        front = tuple((int(t), int(s)) for t, s in data.get("front") or ())
        caches = {str(k): int(v) for k, v in (data.get("caches") or {}).items()} or None
        return cls(int(data["longest_sample"]), int(data["padded_tokens"]), int(data["padded_squares"]), front,
                   caches)


class TokenGuard:
    """A normal run's check of each micro-batch by tokens against the probes' envelope: the samples per
    piece of one beyond it (None: it runs whole), and how many it split."""

    def __init__(self, envelope: TokenEnvelope | None) -> None:
        self.envelope = envelope
        self.split_batches = 0
        """Micro-batches run in pieces because they lay beyond the envelope."""
        self._said_whole = False

    def pieces(self, micro: MicroBatch, *, may_split: bool) -> list[MicroBatch]:
        """`micro` in pieces where it lies beyond the envelope, else itself alone (a batch whose samples'
        lengths are unknown is never checked)."""
        if micro.lengths is None:
            return [micro]
        size = self.piece_samples(len(micro.lengths), micro.width, may_split=may_split)
        return [micro] if size is None else micro.cut(size)

    def piece_samples(self, samples: int, longest: int, *, may_split: bool) -> int | None:
        """Samples per piece of a micro-batch of `samples` samples padded to `longest`, or None to run it
        whole. `may_split`: this rank may run more forward passes than the others (see StepFeed)."""
        envelope = self.envelope
        if envelope is None or samples < 2 or envelope.holds(samples, longest):
            return None
        if not may_split:
            if not self._said_whole:
                self._said_whole = True
                print(f"autofit: a micro-batch of {samples} samples up to {longest} tokens lies beyond what the "
                      f"search's probes ran ({envelope.describe()}) and runs whole: its rank cannot run more "
                      f"forward passes than the others (FSDP2, or a model not given to run.distribute)",
                      file=sys.stderr)
            return None
        self.split_batches += 1
        return envelope.piece_samples(samples, longest)
