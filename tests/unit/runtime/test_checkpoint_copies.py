"""A checkpointed model is still the user's model: `copy.deepcopy`, `pickle`, `state_dict` and
`torch.compile` see each copy compute with its own weights, and a run leaves no wrapper behind.

The bug these guard against: the checkpointed forward was a closure over the original block's bound
forward, so an EMA copy made after `run.checkpoint(...)` computed with the live model's weights
(tests/corpus/late_device.py keeps such a copy)."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

from autofit.config import Config
from autofit.runtime import Run, checkpoint_policy_of


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(3)])
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


def _unwrapped(model: Net) -> Net:
    """A plain Net with `model`'s weights: the reference a checkpointed copy must agree with."""
    plain = Net()
    plain.load_state_dict(model.state_dict())
    return plain


def _checkpointed(segments: int, policy: str = "full") -> Net:
    model = Net()
    Run(Config(batch_size=4, checkpoint_segments=segments, checkpoint_policy=policy)).checkpoint(model.blocks)
    return model


@pytest.mark.parametrize("policy", ["full", "selective"])
def test_an_ema_copy_of_a_checkpointed_model_computes_with_its_own_weights(policy):
    model = _checkpointed(2, policy)
    ema = copy.deepcopy(model)
    with torch.no_grad():
        for block in ema.blocks[:2]:  # the checkpointed ones
            block.weight.zero_()
            block.bias.zero_()
    x = torch.randn(4, 8)
    assert torch.allclose(ema(x), _unwrapped(ema)(x))  # what its own weights compute
    assert not torch.allclose(model(x), ema(x))
    assert [checkpoint_policy_of(b) for b in ema.blocks] == [policy, policy, None]


def test_the_copy_keeps_checkpointing_and_trains_its_own_weights():
    model = _checkpointed(2)
    copied = copy.deepcopy(model)
    before = [p.detach().clone() for p in model.parameters()]
    copied(torch.randn(4, 8)).sum().backward()
    assert all(p.grad is None for p in model.parameters())  # the original took no gradient
    assert all(p.grad is not None for p in copied.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_pickle_and_torch_save_round_trip_a_checkpointed_model():
    model = _checkpointed(2)
    x = torch.randn(4, 8)
    for restored in (pickle.loads(pickle.dumps(model)), _torch_save_load(model)):
        assert torch.allclose(restored(x), model(x))
        assert [checkpoint_policy_of(b) for b in restored.blocks] == ["full", "full", None]
        assert restored.blocks[0].forward.block is restored.blocks[0]  # its own block, not the original


def _torch_save_load(model: torch.nn.Module) -> torch.nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_state_dict_keys_and_module_tree_are_unchanged():
    plain, wrapped = Net(), _checkpointed(3)
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    assert [name for name, _ in wrapped.named_modules()] == [name for name, _ in plain.named_modules()]
    assert all(type(b) is torch.nn.Linear for b in wrapped.blocks)


def test_a_run_takes_its_checkpointing_off_when_it_ends():
    model = Net()
    run = Run(Config(batch_size=4, checkpoint_segments=3))
    with run.control.active():
        run.checkpoint(model.blocks)
        assert [checkpoint_policy_of(b) for b in model.blocks] == ["full"] * 3
    assert [checkpoint_policy_of(b) for b in model.blocks] == [None] * 3
    assert all("forward" not in vars(b) for b in model.blocks)  # the class's own forward again


def test_a_block_with_its_own_forward_gets_it_back():
    block = torch.nn.Linear(8, 8)
    own = block.forward  # an instance attribute set by someone else (another wrapper)
    block.forward = own
    run = Run(Config(batch_size=4, checkpoint_segments=1))
    with run.control.active():
        run.checkpoint([block])
        assert checkpoint_policy_of(block) == "full"
    assert block.forward is own


@pytest.mark.compile
def test_torch_compile_runs_a_checkpointed_model_and_its_copy():
    model = _checkpointed(2)
    ema = copy.deepcopy(model)
    with torch.no_grad():
        for p in ema.blocks[:2].parameters():
            p.zero_()
    x = torch.randn(4, 8)
    compiled, compiled_ema = torch.compile(model), torch.compile(ema)
    assert torch.allclose(compiled(x), model(x), atol=1e-6)
    assert torch.allclose(compiled_ema(x), _unwrapped(ema)(x), atol=1e-6)
    compiled(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
