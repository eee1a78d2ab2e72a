"""Activation offload that overlaps (`ActivationOffload`): what each block offered to `run.checkpoint()` saves
for backward is copied to pinned host memory on a side stream while the forward goes on, and comes back on that
stream a block ahead of the backward that needs it. Parameters (and their views and autocast's casts of them), a
block's own buffers and small tensors stay where they are.

Written here rather than taken: torchtune's `OffloadActivations` (torchtune/training/_activation_offloading.py)
and TRL's copy of it (`get_act_offloading_ctx_manager`) are what it learns from, but neither is a dependency,
both hook the whole model (TRL then keeps the output head out with module hooks) and both find parameters by
`isinstance(Parameter)` (TRL by their storages too), so a Linear's `weight.t()` or autocast's bf16 copy of the
weight still goes to the host. What this one does otherwise:

- It works a block at a time (`CheckpointedForward` enters `group` around each call). In forward a block's
  device tensors are kept until the next block ends; then the compute stream waits for their copies: a block's
  copies overlap the next block's compute and the device holds at most two blocks' worth, however slow the host
  link (torchtune keeps five tensors). In backward, the first saved tensor a block asks for starts bringing back
  the block before it (torchtune and TRL fetch each tensor when its node asks, then overlap within a node).
- A storage is what moves, once per block: views of one (q, k and v split from one projection) share one host
  copy, and each comes back with its own size, strides and offset (torchtune brings back a contiguous tensor; TRL
  keeps a second view of a storage on the device).
- Events, not node hooks: an event per copy, the compute stream waiting on it where a tensor is used or let go; a
  tensor brought back is allocated for the compute stream and `record_stream`'d for the side one, so one that
  autograd drops unused is never reused before its copy is done.
- The device-specific half (`OffloadTransport`: streams, events, pinned memory) is injected: CUDA's in a run, a
  recording fake in the tests (`offload_transport`), shapes alone in the memory estimator.
- Pinned host memory is counted (as CUDA's host allocator rounds it) and budgeted in the process that pins it:
  half the host memory available when the offload starts (`HOST_SHARE`), shared by the ranks of the host. Past it
  the forward raises `HostMemoryExhausted`, a MemoryError: a probe's OOM (the config does not fit the host), a
  normal run's redo at a smaller micro-batch.
"""

from __future__ import annotations

import itertools
import os
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from autofit.errors import UsageError
from autofit.units import format_size

#: Storages smaller than this stay on the device: a copy's launch and its event cost more than they free.
MIN_OFFLOAD_BYTES = 1 << 20
#: The share of the host memory available when an offload starts that it may pin (the host's ranks together):
#: page-locked memory cannot be swapped or reclaimed, and loader workers, the data and the search need the rest.
HOST_SHARE = 0.5


class HostMemoryExhausted(MemoryError):
    """The offload would pin more host memory than its share of the host's (`HOST_SHARE`)."""


class OffloadTransport:
    """The device-specific half of an activation offload: which tensors live in the memory it frees, the copies
    and the stream they run on, the events that order them, and host memory. `CudaTransport` is CUDA's."""

    min_bytes = MIN_OFFLOAD_BYTES
    """Storages smaller than this stay where they are."""

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` lives in the memory the offload frees."""
        raise NotImplementedError

    def to_host(self, flat: torch.Tensor) -> tuple[Any, Any]:
        """Start copying `flat` (a device storage, all of it, as one dimension) to pinned host memory, after what
        the compute stream queued so far: (the host copy, an event that marks the copy's end)."""
        raise NotImplementedError

    def to_device(self, host: Any) -> tuple[torch.Tensor, Any]:
        """Start copying `host` back into new device memory, after what the compute stream queued so far: (the
        device tensor, one dimension as `flat` was, and an event that marks the copy's end)."""
        raise NotImplementedError

    def wait(self, event: Any) -> None:
        """The compute stream goes on only once `event` happened (no host sync)."""
        raise NotImplementedError

    def pinned_bytes(self, nbytes: int) -> int:
        """The pinned host memory that holding `nbytes` takes."""
        return nbytes


class CudaTransport(OffloadTransport):
    """CUDA's: copies on a side stream of the device, into and out of pinned memory from torch's host allocator."""

    def __init__(self, device: torch.device) -> None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self.side = torch.cuda.Stream(self.device)
        """The copies' stream, beside the compute stream (the current one when a copy is asked for)."""

    def holds(self, tensor: torch.Tensor) -> bool:
        return type(tensor) is torch.Tensor and tensor.device == self.device  # no subclass: a DTensor's is no storage

    def _compute(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def _pinned(self, like: torch.Tensor) -> torch.Tensor:
        return torch.empty(like.shape, dtype=like.dtype, pin_memory=True)  # torch's host allocator, cached

    def _on_device(self, like: torch.Tensor) -> torch.Tensor:
        return torch.empty(like.shape, dtype=like.dtype, device=self.device)

    def to_host(self, flat: torch.Tensor) -> tuple[torch.Tensor, Any]:
        self.side.wait_stream(self._compute())  # the copy reads what the compute stream wrote
        with torch.cuda.stream(self.side):
            host = self._pinned(flat)
            host.copy_(flat, non_blocking=True)
            return host, self.side.record_event()

    def to_device(self, host: torch.Tensor) -> tuple[torch.Tensor, Any]:
        flat = self._on_device(host)  # allocated for the compute stream: used and freed there
        self.side.wait_stream(self._compute())  # its memory may be a block the compute stream's queued kernels read
        with torch.cuda.stream(self.side):
            flat.copy_(host, non_blocking=True)
            event = self.side.record_event()
        flat.record_stream(self.side)  # dropped before any wait (a backward that stops early): kept until copied
        return flat, event

    def wait(self, event: Any) -> None:
        self._compute().wait_event(event)

    def pinned_bytes(self, nbytes: int) -> int:
        return 1 << max(0, nbytes - 1).bit_length()  # the host allocator rounds a block up to a power of two


class _Copy:
    """One storage's bytes on the host, shared by the saved tensors of one block's call that view it."""

    __slots__ = ("host", "pinned", "device", "event", "views", "handed", "group", "__weakref__")

    def __init__(self, host: Any, pinned: int, device: torch.Tensor, event: Any, group: _Group) -> None:
        self.host, self.pinned, self.group = host, pinned, group
        self.device: torch.Tensor | None = device
        """Its bytes on the device while there: the forward's own, until it lets them go; or brought back."""
        self.event = event
        """The copy `device` waits for: to the host from the forward's bytes, or back from the host."""
        self.views = 0
        """Saved tensors that view it."""
        self.handed = 0
        """Of them, those unpacked since `device` came (all of them: autograd owns it, it is let go here)."""


class _Saved:
    """What autograd keeps of a saved tensor that left the device: its storage's copy, and how it viewed it."""

    __slots__ = ("copy", "size", "stride", "offset")

    def __init__(self, copy: _Copy, tensor: torch.Tensor) -> None:
        self.copy = copy
        self.size, self.stride, self.offset = tensor.size(), tensor.stride(), tensor.storage_offset()


class _Group:
    """The saved tensors one call of an offered block sent, in forward order; the one sent before it."""

    def __init__(self, previous: _Group | None, persistent: frozenset[int]) -> None:
        self.previous = weakref.ref(previous) if previous is not None else None
        self.persistent = persistent
        """The storages of the block's own parameters and buffers: never sent."""
        self.copies: list[weakref.ref[_Copy]] = []
        self.by_storage: dict[tuple, _Copy] = {}
        """Its copies by their storage (and dtype), while the forward holds its device bytes (no storage is freed and
        reused meanwhile, so the key names one)."""
        self.last_event: Any = None


def _storages_of(block: torch.nn.Module) -> frozenset[int]:
    keys = set()
    for tensor in itertools.chain(block.parameters(), block.buffers()):
        try:
            keys.add(tensor.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError):  # a sharded parameter without local storage
            continue
    return frozenset(keys)


def _a_parameters_cast(tensor: torch.Tensor) -> bool:
    """`tensor` is a parameter's cast (autocast's bf16 copy of a weight, cached for the forward)."""
    fn = tensor.grad_fn
    return fn is not None and fn.name() == "ToCopyBackward0" and any(
        isinstance(getattr(node, "variable", None), torch.nn.Parameter) for node, _ in fn.next_functions)


def made_by_forward(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is an activation the offload may send, whatever its size: a strided tensor the forward
    made (no parameter, view or cast of one, or leaf that needs a gradient) that views its storage whole elements
    at a time. The memory estimator's arithmetic asks it of each tensor a trace saw saved."""
    if tensor.layout != torch.strided or tensor.untyped_storage().nbytes() % tensor.element_size():
        return False
    base = tensor._base if tensor._base is not None else tensor
    return not (isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad)
                or _a_parameters_cast(base))


class ActivationOffload:
    """The offload of one run: `group(block)` around each call of an offered block sends what it saves for
    backward to the host and brings it back for backward (the module's docstring: how, and why so)."""

    def __init__(self, transport: OffloadTransport, budget: int | None = None) -> None:
        self.transport = transport
        self.budget = budget
        """The most pinned host memory it may hold (None: no bound)."""
        self.pinned = 0
        """Pinned host memory its copies hold now."""
        self.peak_pinned = 0
        self.sent_bytes = 0
        """Device bytes it sent to the host, all calls together."""
        self._last: weakref.ref[_Group] | None = None  # the last group that sent anything
        self._held: list[_Group] = []  # groups whose device bytes the forward holds
        self._fetching: _Group | None = None  # the group whose backward asked last

    @contextmanager
    def group(self, block: torch.nn.Module) -> Iterator[None]:
        """Within it, the tensors autograd saves leave the device (those `_leaves` says), as one block's."""
        group = _Group(self._last() if self._last is not None else None, _storages_of(block))
        try:
            with torch.autograd.graph.saved_tensors_hooks(partial(self._pack, group), self._unpack):
                yield
        except BaseException:
            self._let_go()  # a failed forward's tensors go now: an OOM's redo starts without them
            raise
        self._let_go(keep=group)

    def close(self) -> None:
        """The forward's device bytes all go (once copied); what autograd still holds stays good."""
        self._let_go()

    def _leaves(self, tensor: torch.Tensor, group: _Group) -> bool:
        """Whether `tensor` is an activation worth a copy: in the memory the offload frees, made by this forward (no
        parameter, view or cast of one, leaf that needs a gradient, or buffer of the block), and large enough."""
        if not self.transport.holds(tensor) or not made_by_forward(tensor):
            return False
        storage = tensor.untyped_storage()
        return storage.nbytes() >= self.transport.min_bytes and storage._cdata not in group.persistent

    def _pack(self, group: _Group, tensor: torch.Tensor) -> Any:
        if not self._leaves(tensor, group):
            return tensor.detach()  # kept as it is; detached: an output saved as itself would make a cycle
        key = (tensor.untyped_storage()._cdata, tensor.dtype)
        copy = group.by_storage.get(key) or self._send(group, key, tensor)
        copy.views += 1
        return _Saved(copy, tensor)

    def _send(self, group: _Group, key: tuple, tensor: torch.Tensor) -> _Copy:
        nbytes = tensor.untyped_storage().nbytes()
        pinned = self.transport.pinned_bytes(nbytes)
        if self.budget is not None and self.pinned + pinned > self.budget:
            raise HostMemoryExhausted(
                f"Activation offload must keep its pinned host memory within its share of the host's "
                f"({format_size(self.budget)}: half of what was available when it started, shared by this host's "
                f"ranks), but this micro-batch needs more than {format_size(self.pinned + pinned)}: a smaller "
                f"micro-batch, more checkpointing, or no offload fits.")
        # The whole storage, as a view (a tensor saved as a slice of it comes back with its offset and strides)
        flat = tensor.detach().as_strided((nbytes // tensor.element_size(),), (1,), 0)
        host, event = self.transport.to_host(flat)
        copy = _Copy(host, pinned, flat, event, group)
        weakref.finalize(copy, self._unpinned, pinned)
        self.pinned += pinned
        self.peak_pinned = max(self.peak_pinned, self.pinned)
        self.sent_bytes += nbytes
        group.by_storage[key] = copy
        group.copies.append(weakref.ref(copy))
        group.last_event = event
        if group not in self._held:
            self._held.append(group)
        self._last = weakref.ref(group)
        return copy

    def _unpinned(self, pinned: int) -> None:
        self.pinned -= pinned

    def _let_go(self, keep: _Group | None = None) -> None:
        """The forward's device bytes of every held group but `keep` go, once the compute stream waited for
        their copies (the side stream runs in order: a group's last event stands for all of its copies)."""
        for group in [g for g in self._held if g is not keep]:
            self.transport.wait(group.last_event)
            for copy in group.by_storage.values():
                copy.device = copy.event = None
            group.by_storage.clear()
            self._held.remove(group)

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        copy = packed.copy
        if self._held:  # the backward begins: the last blocks' device bytes serve it as they are
            for group in self._held:
                self.transport.wait(group.last_event)
                group.by_storage.clear()
            self._held.clear()
        if copy.group is not self._fetching:  # a block's backward begins: bring back the block before it
            self._fetching = copy.group
            previous = copy.group.previous() if copy.group.previous is not None else None
            for earlier in previous.copies if previous is not None else ():
                if (other := earlier()) is not None and other.device is None:
                    self._fetch(other)
        if copy.device is None:
            self._fetch(copy)
        self.transport.wait(copy.event)
        device = copy.device
        copy.handed += 1
        if copy.handed >= copy.views:  # every view has it: autograd frees it after use
            copy.device = copy.event = None
            copy.handed = 0
        return device.as_strided(packed.size, packed.stride, packed.offset)

    def _fetch(self, copy: _Copy) -> None:
        copy.device, copy.event = self.transport.to_device(copy.host)
        copy.handed = 0


# -- the offload of each device type a run offloads from ---------------------------------------------------

_ACTIVE: dict[str, ActivationOffload] = {}
_TRANSPORTS: list[Callable[[torch.device], OffloadTransport]] = []


@contextmanager
def offload_transport(make: Callable[[torch.device], OffloadTransport]) -> Iterator[None]:
    """Within it, an offload started moves tensors through `make(device)` (the tests' fakes, the memory
    estimator's shapes) instead of the device's own transport."""
    _TRANSPORTS.append(make)
    try:
        yield
    finally:
        _TRANSPORTS.remove(make)


def _transport(device: torch.device) -> OffloadTransport:
    if _TRANSPORTS:
        return _TRANSPORTS[-1](device)
    if device.type != "cuda":
        raise UsageError(f"Activation offload copies on CUDA streams, but the device is {device}.")
    return CudaTransport(device)


def host_budget(available: int | None) -> int | None:
    """The most pinned host memory this process's offload may hold, of the host's `available` bytes (None: no
    bound): `HOST_SHARE` of them, split among the ranks of this host."""
    if available is None:
        return None
    return int(available * HOST_SHARE) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or 1))


def start_offload(device: torch.device, host_available: int | None = None) -> ActivationOffload:
    """A new offload for `device`'s type, the one its blocks use from now on (an earlier one is closed), its
    pinned memory bounded by `host_budget(host_available)`."""
    end_offload(_ACTIVE.get(device.type))
    offload = _ACTIVE[device.type] = ActivationOffload(_transport(device), host_budget(host_available))
    return offload


def offload_for(device_type: str) -> ActivationOffload:
    """The offload a block of `device_type` uses now: the run's, or (a copy of a block called after its run
    ended) one made for it."""
    offload = _ACTIVE.get(device_type)
    return offload if offload is not None else start_offload(torch.device(device_type))


def end_offload(offload: ActivationOffload | None) -> None:
    """`offload` closed and, if it is the one in use, forgotten: nothing of one run reaches the next."""
    if offload is None:
        return
    offload.close()
    for device_type, active in list(_ACTIVE.items()):
        if active is offload:
            del _ACTIVE[device_type]
