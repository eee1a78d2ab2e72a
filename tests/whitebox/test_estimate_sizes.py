"""The sizes `autofit estimate` climbs (autofit.memory._sizes): token caps from the longest sample up for a
function that batches by tokens, as a search climbs them; micro-batches for one that batches by samples."""
from __future__ import annotations

import pytest

from autofit.config import MAX_BATCH, Config
from autofit.errors import UsageError
from autofit.knobs import Offers
from autofit.memory._sizes import Sizes
from autofit.planner import Strategy, nice_batch_sizes


def test_a_function_that_batches_by_tokens_is_sized_by_caps_from_its_longest_sample():
    sizes = Sizes.of(Offers(longest_sample=256), {"token_range": [1, MAX_BATCH], "batch_range": [1, 64]},
                     global_batch=32)
    assert sizes.tokens and sizes.values == tuple(nice_batch_sizes(256, MAX_BATCH))  # no batch range, no global batch
    assert sizes.config(Strategy(precision="bf16", checkpoint_segments=2, checkpoint_policy="selective"), 4096) == Config(
        batch_size=4096, precision="bf16", checkpoint_segments=2, checkpoint_policy="selective", max_tokens=4096)
    assert set(sizes.line()) <= set(sizes.values) and len(sizes.line()) == 4 and min(sizes.line()) >= 4 * 256
    assert Sizes.of(Offers(longest_sample=256), {}, token_range=(512, 2048)).values == (512, 768, 1024, 1536, 2048)
    with pytest.raises(UsageError, match="must reach the longest sample"):
        Sizes.of(Offers(longest_sample=256), {}, token_range=(1, 100))


def test_a_function_that_batches_by_samples_keeps_its_micro_batches():
    sizes = Sizes.of(Offers(), {"batch_range": [1, 64]}, global_batch=32)
    assert not sizes.tokens and sizes.values == (1, 2, 4, 8, 16, 32)
    assert sizes.config(Strategy(precision="fp32"), 8) == Config(batch_size=8, accumulation_steps=4)
    assert sizes.line() == [16, 32]  # none of the line's batches in range: the largest two
