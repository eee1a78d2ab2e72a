"""The sizes `autofit estimate` climbs for one function: micro-batches, or for a function that batches by
tokens (run.token_batches) the token caps (`max_tokens`) a search would climb, from its longest sample up."""

from __future__ import annotations

from dataclasses import dataclass

from autofit.config import MAX_BATCH, Config
from autofit.knobs import Offers
from autofit.planner import STRATEGY_KNOBS, Strategy, divisors_in, nice_batch_sizes, token_caps

_LARGEST_BATCH = 2**16
#: Batches estimated to fit each strategy's line: small ones are often below where activations
#: take over from the optimizer step's peak, so the line is fitted on the largest two that rise.
_LINE_BATCHES = (64, 256, 1024, 4096)


@dataclass(frozen=True)
class Sizes:
    """The sizes to consider, smallest first, and how a strategy and a size make a config."""

    values: tuple[int, ...]
    tokens: bool = False
    """The sizes are token caps: each config's `max_tokens`, no cap on its samples (as a search's)."""
    global_batch: int | None = None
    """By samples: micro-batch x accumulation kept equal to it (None: accumulation 1)."""
    longest_sample: int | None = None
    """By tokens: the data's longest sample, the first cap."""

    @classmethod
    def of(cls, offers: Offers, options: dict, *, batch_range: tuple[int, int] | None = None,
           token_range: tuple[int, int] | None = None, global_batch: int | None = None) -> Sizes:
        """The sizes for a function that `offers` what it does and declared `options` to @autofit, the command
        line's ranges over the declared ones. By tokens, the batch range and global batch do not apply."""
        longest = offers.longest_sample
        if longest:
            low, high = token_caps(token_range or tuple(options.get("token_range") or (1, MAX_BATCH)), longest)
            return cls(tuple(nice_batch_sizes(low, high)), tokens=True, longest_sample=longest)
        global_batch = global_batch or options.get("global_batch")
        low, high = batch_range or tuple(options.get("batch_range") or (1, _LARGEST_BATCH))
        high = min(high, _LARGEST_BATCH)
        values = divisors_in(global_batch, low, high) if global_batch else nice_batch_sizes(low, high)
        return cls(tuple(values), global_batch=global_batch)

    def config(self, strategy: Strategy, size: int) -> Config:
        """`strategy` at `size`: a micro-batch (its accumulation keeping the global batch), or a token cap."""
        accumulation = self.global_batch // size if self.global_batch and not self.tokens else 1
        return Config(batch_size=size, max_tokens=size if self.tokens else None,
                      **{**{k.name: k.acting(strategy) for k in STRATEGY_KNOBS}, "accumulation_steps": accumulation})

    def line(self) -> list[int]:
        """The sizes each strategy's line is fitted on. Token caps four times apart from four longest
        samples (and 1024 tokens) up: their worst batches hold several samples, past the optimizer's peak."""
        if not self.tokens:
            return [b for b in _LINE_BATCHES if b in self.values] or list(self.values[-2:])
        targets = [max(self.longest_sample, 256) * 4**k for k in (1, 2, 3, 4)]
        return sorted({min(self.values, key=lambda cap: abs(cap - target)) for target in targets})
