"""Gradient accumulation over micro-batches of different token counts: with `weight_by_tokens`, the
step equals one big batch's token mean to 1e-5 (the bug Transformers fixed in 4.46); the plain
average of micro-batch means does not."""

from __future__ import annotations

import pytest
import torch

from autofit import Config
from autofit.errors import UsageError
from autofit.runtime import Run

PAD = -100


def _batches(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three micro-batches of 4 sequences, padded to their longest, with very different real lengths."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for longest in (3, 12, 30):
        lengths = torch.randint(1, longest + 1, (4,), generator=generator)
        lengths[0] = longest
        x = torch.randn(4, longest, 8, generator=generator)
        y = torch.randint(0, 5, (4, longest), generator=generator)
        for row, n in enumerate(lengths):
            y[row, n:] = PAD
        out.append((x, y))
    return out


def _model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Linear(8, 5)


def _loss(model, x, y) -> torch.Tensor:
    """The mean over the real (non-padding) tokens of the micro-batch, as language models compute it."""
    return torch.nn.functional.cross_entropy(model(x).reshape(-1, 5), y.reshape(-1), ignore_index=PAD)


def _real_tokens(batch) -> int:
    return int((batch[1] != PAD).sum())


def _one_step(weight_by_tokens: bool) -> torch.Tensor:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    run = Run(Config(batch_size=4, accumulation_steps=3), "cpu", probing=False)
    with run.control.active():
        for x, y in run.batches(_batches(), tokens=_real_tokens, weight_by_tokens=weight_by_tokens):
            run.backward(_loss(model, x, y), optimizer)
    run.finish()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _one_big_batch() -> torch.Tensor:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    logits = torch.cat([model(x).reshape(-1, 5) for x, _ in _batches()])
    targets = torch.cat([y.reshape(-1) for _, y in _batches()])
    torch.nn.functional.cross_entropy(logits, targets, ignore_index=PAD).backward()
    optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_weighting_by_tokens_equals_one_big_batch():
    assert torch.allclose(_one_step(weight_by_tokens=True), _one_big_batch(), atol=1e-5, rtol=0)


def test_the_plain_average_of_micro_batch_means_does_not():
    assert not torch.allclose(_one_step(weight_by_tokens=False), _one_big_batch(), atol=1e-3, rtol=0)


def test_weighting_by_tokens_needs_a_token_count():
    run = Run(Config(batch_size=4), "cpu", probing=False)
    with pytest.raises(UsageError, match="needs tokens="):
        next(iter(run.batches(_batches(), weight_by_tokens=True)))
