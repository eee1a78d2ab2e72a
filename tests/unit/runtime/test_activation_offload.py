"""Activation offload (`offload_activations`): the blocks a function offers to `run.checkpoint()` send what they
save for backward to pinned host memory through the run's `ActivationOffload`, outside any checkpoint of theirs.

On this CPU-only machine a run is given a CUDA device (its tensors stay on the CPU: nothing here reaches for a
GPU) and the offload's device half is a recording fake (`Recording`, put in place with `offload_transport`): its
copies are real CPU copies, its events numbered tokens, every call logged. What is proven: which tensors leave
(activations, once per storage; never a parameter, its view or its autocast copy), the order of the copies and
waits (a block's copies overlap the next block, the backward brings back a block ahead), that each tensor comes
back with its own strides, that the gradients are the plain run's, that the host copies are gone once the step's
graph is, and the host bound. Not proven here: that CUDA's streams overlap (the GPU step's figures), nor that
CUDA's host allocator unpins (tests/whitebox/test_offload_release.py fakes torch's part; the GPU check reads it)."""

from __future__ import annotations

import copy

import pytest
import torch

from autofit.config import KNOB, Config
from autofit.errors import UsageError
from autofit.runtime import (
    HostMemoryExhausted,
    Run,
    RunSettings,
    checkpoint_policy_of,
    is_oom,
    offload_transport,
)
from tests.support.offload import Recording

#: A device whose type offloads (the run never allocates on it here: the tensors are the test's, on the CPU).
GPU = torch.device("cuda")


@pytest.fixture
def recording() -> Recording:
    transport = Recording()
    with offload_transport(lambda device: transport):
        yield transport


def _blocks(n: int = 3, width: int = 8) -> torch.nn.ModuleList:
    torch.manual_seed(0)
    return torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
                                for _ in range(n)])


def _step(blocks: torch.nn.Module, config: Config, device: torch.device = GPU, *, autocast: bool = False,
          after_forward=None, host_memory=None) -> list[torch.Tensor]:
    """One forward and backward of `blocks` offered to a run of `config`: their gradients."""
    blocks.zero_grad(set_to_none=True)
    run = Run(RunSettings(config, device, host_memory=host_memory))
    with run.control.active():
        run.checkpoint(blocks)
        h = torch.ones(4, 8)  # the batch: each block saves alike
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            for block in blocks:
                h = block(h)
        if after_forward is not None:
            after_forward(run)
        h.float().square().sum().backward()
    return [p.grad.clone() for p in blocks.parameters()]


def test_each_block_sends_its_activations_and_keeps_its_weights(recording):
    blocks = _blocks()
    _step(blocks, Config(batch_size=4))
    assert recording.log == []  # off by default
    _step(blocks, Config(batch_size=4, offload_activations=True))
    # Each block saves its Linear's input and weight (a view, weight.t()) and its GELU's input: the two inputs go.
    assert [entry for entry in recording.log if entry[0] == "to_host"] == [("to_host", n) for n in range(6)]
    weights = {p.data_ptr() for p in blocks.parameters()}
    assert not weights & set(recording.sent_pointers)


def test_a_checkpointed_block_sends_its_input_alone(recording):
    _step(_blocks(), Config(batch_size=4, checkpoint_segments=2, offload_activations=True))
    assert len(recording.sent_pointers) == 1 + 1 + 2  # two checkpoints' inputs, then the last block's two


def test_autocasts_copy_of_a_weight_stays_and_the_activations_casts_go(recording):
    blocks = _blocks()
    _step(blocks, Config(batch_size=4, precision="bf16", offload_activations=True), autocast=True)
    assert len(recording.sent_pointers) == 2 * 3  # each Linear's bf16 input and each GELU's input; no weight


class _Peek(torch.autograd.Function):
    """Saves its input and, in backward, notes how the saved tensor came back."""

    seen: list[tuple] = []

    @staticmethod
    def forward(ctx, tensor):
        ctx.save_for_backward(tensor)
        return tensor * 2

    @staticmethod
    def backward(ctx, grad):
        (saved,) = ctx.saved_tensors
        _Peek.seen.append((saved.size(), saved.stride(), saved.storage_offset(), saved.sum().item()))
        return grad * 2


class _Split(torch.nn.Module):
    """One projection split in three (q, k, v as attention splits them): three views of one storage."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(8, dim=-1)
        return q * k + _Peek.apply(v)


def test_views_of_one_storage_share_one_copy_and_each_comes_back_as_it_was(recording):
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList([_Split()])
    _Peek.seen.clear()
    plain = _step(blocks, Config(batch_size=4))
    kept = _Peek.seen.pop()
    offloaded = _step(blocks, Config(batch_size=4, offload_activations=True))
    assert _Peek.seen.pop() == kept and kept[1:3] == ((24, 1), 16)  # v: strided, at its offset, its values
    assert len(recording.sent_pointers) == 2  # the input, and the projection's one storage for q, k and v
    assert all(torch.equal(a, b) for a, b in zip(plain, offloaded, strict=True))


@pytest.mark.parametrize(("segments", "policy"), [(0, "full"), (2, "full"), (2, "selective")])
def test_the_gradients_are_the_plain_runs(recording, segments, policy):
    plain = _step(_blocks(), Config(batch_size=4, checkpoint_segments=segments, checkpoint_policy=policy))
    offloaded = _step(_blocks(), Config(batch_size=4, checkpoint_segments=segments, checkpoint_policy=policy,
                                        offload_activations=True))
    assert all(torch.equal(a, b) for a, b in zip(plain, offloaded, strict=True))


def test_a_blocks_copies_overlap_the_next_block_and_the_backward_brings_back_a_block_ahead(recording):
    alive: list[int] = []
    _step(_blocks(4), Config(batch_size=4, offload_activations=True),
          after_forward=lambda run: alive.extend(n for n, flat in enumerate(recording.flats) if flat() is not None))
    forward = [("to_host", 0), ("to_host", 1),  # block 0: its input and its GELU's
               ("to_host", 2), ("to_host", 3), ("wait", "sent", 1),  # block 1 ended: block 0's copies must be done
               ("to_host", 4), ("to_host", 5), ("wait", "sent", 3),
               ("to_host", 6), ("to_host", 7), ("wait", "sent", 5)]
    backward = [("wait", "sent", 7),  # the backward begins: the last block's tensors serve as they are
                ("to_device", 4), ("to_device", 5),  # block 2 comes back while block 3's backward runs
                ("wait", "sent", 7), ("wait", "sent", 6),
                ("to_device", 2), ("to_device", 3), ("wait", "back", 5), ("wait", "back", 4),
                ("to_device", 0), ("to_device", 1), ("wait", "back", 3), ("wait", "back", 2),
                ("wait", "back", 1), ("wait", "back", 0)]
    assert recording.log == forward + backward
    assert alive == [6, 7]  # after the forward the device holds the last block's tensors alone


class _RunsOutOfMemory(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 96.00 MiB.")


def test_a_forward_that_runs_out_of_memory_lets_go_of_every_tensor_it_held_at_once(recording):
    blocks = _blocks(3)
    blocks[2][1] = _RunsOutOfMemory()  # after its Linear saved its input
    run = Run(Config(batch_size=4, offload_activations=True), GPU)
    with run.control.active():
        run.checkpoint(blocks)
        h = torch.ones(4, 8)
        with pytest.raises(torch.OutOfMemoryError):
            for block in blocks:
                h = block(h)
        # an OOM redo's smaller micro-batch starts without the failed one's tensors on the device
        assert len(recording.flats) == 5 and all(flat() is None for flat in recording.flats)


def test_a_micro_batch_over_the_hosts_share_is_an_out_of_memory_in_one_line(recording, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two ranks on this host: each pins a quarter of what it has
    with pytest.raises(HostMemoryExhausted) as raised:  # two of the 128-byte copies fit in 300 bytes, not three
        _step(_blocks(), Config(batch_size=4, offload_activations=True), host_memory=lambda: 1200)
    assert len(recording.sent_pointers) == 2
    assert is_oom(raised.value) and "\n" not in str(raised.value)
    assert str(raised.value).startswith("Activation offload must keep its pinned host memory within its share of "
                                        "the host's (300 B")


def test_the_host_copies_go_with_the_steps_graph_and_the_offload_with_the_run(recording):
    offloads = []
    _step(_blocks(), Config(batch_size=4, offload_activations=True),
          after_forward=lambda run: offloads.append(run.control.panel.offload))
    (offload,) = offloads
    assert recording.hosts and recording.live_host_copies() == 0
    assert offload.pinned == 0 and offload.peak_pinned == 6 * 128 and offload.sent_bytes == 6 * 128


def test_the_users_model_comes_back_as_it_was_and_a_later_call_offloads_nothing(recording):
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
    assert run.control.panel.offload is None
    assert all("forward" not in vars(b) for b in blocks)  # the class's own forward again
    recording.log.clear()
    _step(blocks, Config(batch_size=4))
    assert recording.log == []


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
