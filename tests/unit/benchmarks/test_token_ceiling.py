"""benchmarks.token_ceiling's collate pads a batch's length up to the multiple, as run.pad_multiple asks of a
script's own collate, and leaves a batch already at a multiple as it is."""

import torch

from benchmarks.token_ceiling import _padded
from tests.corpus.sft_tokens import IGNORE, PAD, collate


def _items(*lengths):
    return [(torch.arange(1, n + 1), torch.arange(1, n + 1)) for n in lengths]


def test_the_benchmarks_collate_pads_a_batch_up_to_its_multiple_with_padding_and_ignored_labels():
    x, y = _padded(_items(5, 3), collate=collate, multiple=8, pad=PAD, ignore=IGNORE)
    assert x.shape == y.shape == (2, 8)
    assert (x[:, 5:] == PAD).all() and (y[:, 4:] == IGNORE).all()
    assert x[0, :5].tolist() == [1, 2, 3, 4, 5]


def test_a_batch_at_its_multiple_is_left_as_the_collate_made_it():
    x, y = _padded(_items(8, 2), collate=collate, multiple=8, pad=PAD, ignore=IGNORE)
    expected = collate(_items(8, 2))
    assert torch.equal(x, expected[0]) and torch.equal(y, expected[1])
