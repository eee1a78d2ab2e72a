"""What one traced step recorded (autofit.memory._step_trace makes it): plain lists and numbers, no torch, so that
the arithmetic over it (autofit.memory._traced_peaks) imports none in the processes that only read answers."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from autofit.memory._estimator import PARTS

#: MemTracker's categories -> the index of autofit's part.
PART_OF = {"PARAM": 0, "BUFFER": 0, "GRAD": 1, "OPT": 2, "ACT": 3, "TEMP": 4, "OTH": 5}
PARAMETERS, ACTIVATIONS = PARTS.index("parameters"), PARTS.index("activations")


@dataclass
class Instance:
    """One forward of an offered block, under grad: the ops it spans and when its backward began."""

    block: int
    first: int
    """The first op of its forward."""
    last: int = -1
    """The last op of its forward."""
    backward: int | None = None
    """The op index its backward began at (its first output's gradient); None: no backward seen."""
    inputs: list[int] = field(default_factory=list)
    """The storages of its inputs (what a checkpoint keeps of it)."""
    inputs_movable: list[bool] = field(default_factory=list)
    """Of each input, whether the offload may send it (as `StepTrace.pack_movable`)."""
    inputs_nbytes: list[int] = field(default_factory=list)
    """Each input's storage's bytes."""
    kept: list[int] = field(default_factory=list)
    """The storages of what its ops of `saved_ops` returned (what selective checkpointing keeps)."""


@dataclass
class StepTrace:
    """What one traced run of the function held, op by op (see the module's docstring); plain lists, so that
    the arithmetic over it needs no torch."""

    size: int
    """The samples of its micro-batch (by tokens: of the cap's worst batch)."""
    rows: list[tuple[int, ...]] = field(default_factory=list)
    """Bytes alive after each op, by part (PARTS' order)."""
    signature: int = 0
    """A checksum of the ops' names in order: two traces of one program at two sizes share it."""
    storage_bytes: list[int] = field(default_factory=list)
    storage_part: list[int] = field(default_factory=list)
    storage_made: list[int] = field(default_factory=list)
    storage_last: list[int | None] = field(default_factory=list)
    """The last op each storage was alive after (None: alive at the end)."""
    pack_storage: list[int] = field(default_factory=list)
    """Each saved tensor's storage (-1: one the tracker does not follow)."""
    pack_at: list[int] = field(default_factory=list)
    pack_instance: list[int | None] = field(default_factory=list)
    pack_released: list[int | None] = field(default_factory=list)
    """The op index at which autograd let it go (alive through the op before); None: held to the end."""
    pack_movable: list[bool] = field(default_factory=list)
    """Whether the run's activation offload may send it, whatever its size (autofit.runtime's `made_by_forward`,
    and no parameter's or buffer's storage)."""
    pack_nbytes: list[int] = field(default_factory=list)
    """Its storage's bytes (what the offload sends, once per block's call, and brings back)."""
    fresh: dict[int, int] = field(default_factory=dict)
    """The storages backward got in place of a saved tensor -> the saved tensor (its index)."""
    instances: list[Instance] = field(default_factory=list)
    blocks: int = 0
    """Blocks offered to run.checkpoint() (0: none)."""
    offload_min_bytes: int = 0
    """The smallest storage the run's activation offload sends (autofit.runtime's `MIN_OFFLOAD_BYTES`)."""
    irregular: str | None = None
    """Why checkpointing and offload cannot be described by arithmetic over this trace (nested blocks)."""

    @property
    def ops(self) -> int:
        return len(self.rows)

    @functools.cached_property
    def plain_end(self) -> dict[int, int]:
        """Each saved storage's last op autograd holds it (no checkpointing, no offload)."""
        ends: dict[int, int] = {}
        for storage, released in zip(self.pack_storage, self.pack_released):
            if storage >= 0:
                ends[storage] = max(ends.get(storage, -1), (self.ops if released is None else released) - 1)
        return ends

    @functools.cached_property
    def backward_ends(self) -> dict[int, int]:
        """Each instance's op at which autograd let the last of what it saved go (its backward's end)."""
        ends: dict[int, int] = {}
        for index, released in zip(self.pack_instance, self.pack_released):
            if index is not None:
                ends[index] = max(ends.get(index, -1), self.ops if released is None else released)
        return ends
