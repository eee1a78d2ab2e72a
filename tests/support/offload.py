"""A recording fake of the activation offload's device half (autofit.runtime's `OffloadTransport`), for the tests
that run an offload on this CPU-only machine: its copies are real CPU copies (the values are right), its events
numbered tokens, every call logged, and every host copy and forward tensor it was given watched by a weak
reference. It proves the offload's logic (what leaves, in what order, what is let go), never CUDA's streams."""

from __future__ import annotations

import itertools
import weakref

import torch

from autofit.runtime import OffloadTransport


class HostCopy:
    """One host copy: its number in the order sent, and its bytes."""

    __slots__ = ("number", "data", "__weakref__")

    def __init__(self, number: int, data: torch.Tensor) -> None:
        self.number, self.data = number, data


class Recording(OffloadTransport):
    """The offload's device half on the CPU: real copies, numbered events, a log of every call."""

    min_bytes = 0

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.hosts: list[weakref.ref] = []
        """The host copies, in the order sent (dead once nothing holds them)."""
        self.flats: list[weakref.ref] = []
        """The forward's tensors each copy was made from (dead once the offload let them go)."""
        self.sent_pointers: list[int] = []
        self._numbers = itertools.count()

    def holds(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cpu"

    def to_host(self, flat: torch.Tensor) -> tuple[HostCopy, tuple]:
        host = HostCopy(next(self._numbers), flat.clone())
        self.log.append(("to_host", host.number))
        self.hosts.append(weakref.ref(host))
        self.flats.append(weakref.ref(flat))
        self.sent_pointers.append(flat.data_ptr())
        return host, ("sent", host.number)

    def to_device(self, host: HostCopy) -> tuple[torch.Tensor, tuple]:
        self.log.append(("to_device", host.number))
        return host.data.clone(), ("back", host.number)

    def wait(self, event: tuple) -> None:
        self.log.append(("wait", *event))

    def live_host_copies(self) -> int:
        return sum(host() is not None for host in self.hosts)
