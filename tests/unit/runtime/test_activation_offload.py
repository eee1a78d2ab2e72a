"""Activation offload (`offload_activations`): the blocks a function offers to `run.checkpoint()` keep what
their backward needs in host memory, through PyTorch's `save_on_cpu`, outside any checkpoint of theirs.

On this CPU-only machine a run is given a CUDA device (its tensors stay on the CPU: nothing here reaches
for a GPU), so the offload is applied as on a GPU: each saved tensor is copied out in forward and back in
backward. What is proven: which tensors leave (a checkpointed block's inputs alone), that the gradients are
the plain run's, that the user's model comes back as it was, and that the CPU device refuses the knob."""

from __future__ import annotations

import copy

import pytest
import torch

from autofit.config import KNOB, Config
from autofit.errors import UsageError
from autofit.runtime import Run, checkpoint_policy_of

#: A device whose type offloads (the run never allocates on it here: the tensors are the test's, on the CPU).
GPU = torch.device("cuda")


def _blocks() -> torch.nn.ModuleList:
    torch.manual_seed(0)
    return torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()) for _ in range(3)])


def _step(blocks: torch.nn.ModuleList, config: Config, device: torch.device = GPU) -> list[torch.Tensor]:
    """One forward and backward of `blocks` offered to a run of `config`: their gradients."""
    blocks.zero_grad(set_to_none=True)
    run = Run(config, device)
    with run.control.active():
        run.checkpoint(blocks)
        h = torch.ones(4, 8, requires_grad=True)  # each block saves alike
        for block in blocks:
            h = block(h)
        h.square().sum().backward()
    return [p.grad.clone() for p in blocks.parameters()]


@pytest.fixture
def packed(monkeypatch) -> list[tuple[int, ...]]:
    """The shapes of the tensors PyTorch's save_on_cpu copies out (the run looks it up when a block runs)."""
    shapes: list[tuple[int, ...]] = []
    real = torch.autograd.graph.save_on_cpu

    class Counted(real):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            pack = self.pack_hook
            self.pack_hook = lambda tensor: (shapes.append(tuple(tensor.shape)), pack(tensor))[1]

    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", Counted)
    return shapes


def test_every_offered_block_sends_what_it_saves_to_the_host_and_a_checkpointed_one_its_input_alone(packed):
    _step(_blocks(), Config(batch_size=4))
    assert packed == []  # off by default
    _step(_blocks(), Config(batch_size=4, offload_activations=True))
    # Each block saves its Linear's input and weight and the GELU's input.
    assert packed == [(4, 8), (8, 8), (4, 8)] * 3
    packed.clear()
    _step(_blocks(), Config(batch_size=4, checkpoint_segments=2, offload_activations=True))
    assert packed == [(4, 8), (4, 8), (4, 8), (8, 8), (4, 8)]  # two inputs, then the last block's three


@pytest.mark.parametrize("segments", [0, 2])
def test_the_gradients_are_the_plain_runs(segments):
    plain = _step(_blocks(), Config(batch_size=4, checkpoint_segments=segments))
    offloaded = _step(_blocks(), Config(batch_size=4, checkpoint_segments=segments, offload_activations=True))
    assert all(torch.allclose(a, b) for a, b in zip(plain, offloaded, strict=True))


def test_a_saved_tensor_is_a_copy_while_the_block_is_offloaded():
    block = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    for offload, copied in ((False, False), (True, True)):
        run = Run(Config(batch_size=4, offload_activations=offload), GPU)
        with run.control.active():
            run.checkpoint([block])
            saved = block(x).grad_fn._saved_mat1  # the Linear's input, as backward gets it
        assert (saved.data_ptr() != x.data_ptr()) == copied and torch.equal(saved, x)


def test_the_users_model_comes_back_as_it_was_and_a_later_call_offloads_nothing(packed):
    blocks = _blocks()
    keys = list(blocks.state_dict())
    run = Run(Config(batch_size=4, checkpoint_segments=1, offload_activations=True), GPU)
    with run.control.active():
        run.checkpoint(blocks)
        copied = copy.deepcopy(blocks)  # an EMA's copy made while offloaded: its own weights
        with torch.no_grad():
            copied[1][0].weight.zero_()
        assert not torch.allclose(copied[1](torch.ones(2, 8)), blocks[1](torch.ones(2, 8)))
        assert list(blocks.state_dict()) == keys and checkpoint_policy_of(blocks[0]) == "full"
    assert all("forward" not in vars(b) for b in blocks)  # the class's own forward again
    packed.clear()
    _step(blocks, Config(batch_size=4))
    assert packed == []


def test_the_cpu_device_refuses_it_in_one_line_and_a_search_there_never_considers_it():
    with pytest.raises(UsageError, match=r"^Activation offload .* the device is cpu, .*: set offload_activations "
                                         r"to false [^\n]*$"):
        _step(_blocks(), Config(batch_size=4, offload_activations=True), torch.device("cpu"))
    assert KNOB["offload_activations"].device_values("cpu") == (False,)
    assert KNOB["offload_activations"].device_values("cuda") == (False, True)


def test_its_label_and_its_json():
    config = Config(batch_size=8, checkpoint_segments=2, offload_activations=True)
    assert config.label() == "fp32 b=8 ckpt=2 act-offload"
    assert config.to_dict()["offload_activations"] is True
    assert "offload_activations" not in Config(batch_size=8).to_dict()  # older files keep their form
    assert Config.from_dict({"batch_size": 8}).offload_activations is False
