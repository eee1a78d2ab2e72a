"""The one walk over a nested batch (autofit.runtime.map_batch) and what is built on it: moving a
batch to the device, counting its samples, cutting it into micro-batches."""
from collections import OrderedDict, UserDict, namedtuple

import torch

from autofit.runtime import batch_len, batch_tensors, count_samples, map_batch, split_batch, to_device

Pair = namedtuple("Pair", "x y")


class Encoding(UserDict):
    """A mapping that is no dict, as HF's BatchEncoding."""


def _nested():
    return {
        "ids": torch.arange(8).view(8, 1),
        "pair": Pair(torch.arange(8), torch.zeros(8, 2)),
        "list": [torch.ones(8, 3), ("label", torch.full((8,), 2.0))],
        "encoding": Encoding(mask=torch.ones(8, 4)),
        "ordered": OrderedDict(scale=torch.tensor(0.5)),  # a scalar: no samples to cut
        "name": "b",
        "n": 3,
        "none": None,
    }


def test_map_batch_reaches_every_tensor_and_keeps_every_container_type():
    batch = _nested()
    doubled = map_batch(batch, lambda tensor: tensor * 2)
    assert type(doubled["pair"]) is Pair and type(doubled["list"]) is list and type(doubled["list"][1]) is tuple
    assert type(doubled["encoding"]) is Encoding and type(doubled["ordered"]) is OrderedDict
    assert (doubled["name"], doubled["n"], doubled["none"]) == ("b", 3, None)
    assert doubled["list"][1][0] == "label"
    for before, after in zip(batch_tensors(batch), batch_tensors(doubled), strict=True):
        assert torch.equal(after, before * 2)
    assert len(list(batch_tensors(batch))) == 7


def test_batch_tensors_walks_depth_first_in_order():
    a, b, c, d = (torch.full((2,), float(i)) for i in range(4))
    assert [t[0].item() for t in batch_tensors([a, {"k": (b, "x", c)}, Pair(d, 1)])] == [0.0, 1.0, 2.0, 3.0]
    assert list(batch_tensors("text")) == [] and list(batch_tensors(None)) == []


def test_to_device_moves_every_tensor_and_leaves_the_rest():
    batch = _nested()
    moved = to_device(batch, torch.device("meta"))
    assert all(t.device.type == "meta" for t in batch_tensors(moved))
    assert all(t.device.type == "cpu" for t in batch_tensors(batch))  # the loader's batch is untouched
    assert type(moved["pair"]) is Pair and moved["name"] == "b"


def test_samples_are_counted_from_the_first_tensor_with_a_first_dimension():
    assert count_samples(_nested()) == 8
    assert count_samples((torch.tensor(3.0), torch.zeros(5, 2))) == 5  # a scalar first counts no samples
    assert count_samples({"text": "no tensor"}) == 1 and batch_len({"text": "no tensor"}) is None
    assert batch_len(torch.tensor(1.0)) is None


def test_split_batch_cuts_every_tensor_alike_and_keeps_the_rest():
    batch = _nested()
    pieces = split_batch(batch, 3)
    assert [count_samples(p) for p in pieces] == [3, 3, 2]
    for i, whole in enumerate(batch_tensors(batch)):
        parts = [list(batch_tensors(p))[i] for p in pieces]
        if whole.dim() == 0:
            assert all(part is whole for part in parts)  # given to every piece
        else:
            assert torch.equal(torch.cat(parts), whole)
    assert all(p["name"] == "b" and type(p["pair"]) is Pair and type(p["encoding"]) is Encoding for p in pieces)
    assert pieces[0]["ids"].data_ptr() == batch["ids"].data_ptr()  # views, no copy
    whole = (torch.ones(4), torch.ones(4))
    assert split_batch(whole, 4) == [whole]
    assert split_batch("no tensor", 2) == ["no tensor"]
