"""The activation offload's device bytes, from a trace (autofit.memory._step_trace) without it: what autofit's
offload (autofit.runtime._offload, `ActivationOffload`) does to the tensors the offered blocks save, told as
intervals of bytes over the trace's ops for autofit.memory._traced_peaks to add.

The runtime's rules, as the arithmetic follows them:
- What leaves: in an offloaded block's call, each saved tensor the forward made (`made_by_forward`: no parameter,
  view or cast of one, or leaf that needs a gradient; no parameter's or buffer's storage) whose storage holds at
  least the runtime's `MIN_OFFLOAD_BYTES` (as the trace recorded it); a checkpointed block saves only its inputs,
  and they leave by the same rule. Which storages pass depends on the micro-batch: `Sent.at` decides it at each
  size.
- One copy per storage and call: views of one storage share it, and it comes back as the whole storage.
- In forward, a call's storages stay on the device until the next block's forward ends (the forward's own bytes,
  held past their natural end); where the backward begins first (the last block), they serve the backward as
  they are, until autograd lets the last of their views go.
- In backward, the first saved tensor a call's backward asks for brings back that call's copies and the copies
  of the call before it (its prefetch), each held until autograd lets the last of its views go.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from autofit.memory._trace_data import ACTIVATIONS, StepTrace


@dataclass(frozen=True)
class Sent:
    """The saved tensors of offloaded blocks the offload sends at one size: by the trace's index of each saved
    tensor, and (instance, position) of each input a checkpointed block saves."""

    packs: frozenset[int] = frozenset()
    inputs: frozenset[tuple[int, int]] = frozenset()

    @classmethod
    def at(cls, small: StepTrace, large: StepTrace | None, layout, size: float) -> Sent:
        """What leaves at `size` samples under `layout`: a storage's bytes are affine in the samples, so they are
        the two traces' interpolated (the same storage at both)."""
        span = (large.size - small.size) if large is not None else 1
        other = large if large is not None else small

        def enough(at_small: int, at_large: int) -> bool:
            return at_small + (size - small.size) * (at_large - at_small) / span >= small.offload_min_bytes

        packs = frozenset(
            p for p, index in enumerate(small.pack_instance)
            if index is not None and small.pack_movable[p] and layout.offloaded(small.instances[index].block)
            and layout.policy(small.instances[index].block) is None
            and enough(small.pack_nbytes[p], other.pack_nbytes[p]))
        inputs = frozenset(
            (index, position) for index, instance in enumerate(small.instances)
            if layout.offloaded(instance.block) and layout.policy(instance.block) is not None
            for position, movable in enumerate(instance.inputs_movable)
            if movable and enough(instance.inputs_nbytes[position], other.instances[index].inputs_nbytes[position]))
        return cls(packs, inputs)

    def input_storages(self, trace: StepTrace, index: int) -> set[int]:
        """The storages of instance `index`'s inputs that leave."""
        inputs = trace.instances[index].inputs
        return {inputs[position] for i, position in self.inputs if i == index}


@dataclass
class _Copy:
    """One storage one call sends: its bytes, when autograd first asks for it and when it lets the last view go."""

    storage: int
    nbytes: int
    part: int
    asked: int
    done: int


def offloaded(trace: StepTrace, sent: Sent, add) -> dict[int, int]:
    """The fetched copies' bytes added through `add(part, first, last, bytes)`; returns each sent storage's last
    op on the device in forward (for the caller to hold it that long, beside autograd's own holds)."""
    groups = _groups(trace, sent)
    asked = {index: min(copy.asked for copy in copies) for index, copies in groups.items()}
    unpacks = sorted(asked.values())
    order = sorted(groups)
    forward_end: dict[int, int] = {}
    for at, index in enumerate(order):
        instance = trace.instances[index]
        begins = unpacks[bisect.bisect_right(unpacks, instance.last)] \
            if bisect.bisect_right(unpacks, instance.last) < len(unpacks) else trace.ops
        following = trace.instances[index + 1] if index + 1 < len(trace.instances) else None
        handed_over = following is None or following.last >= begins  # the backward begins before it is let go
        prefetch = asked[order[at + 1]] if at + 1 < len(order) else trace.ops
        fetched = min(asked[index], prefetch)
        for copy in groups[index]:
            if handed_over:
                forward_end[copy.storage] = max(forward_end.get(copy.storage, -1), copy.done)
                continue
            forward_end[copy.storage] = max(forward_end.get(copy.storage, -1), following.last)
            add(copy.part, fetched, copy.done, copy.nbytes)
    return forward_end


def _groups(trace: StepTrace, sent: Sent) -> dict[int, list[_Copy]]:
    """Each sending call's copies (by its instance), one per storage."""
    fresh_of = {pack: storage for storage, pack in trace.fresh.items()}
    by_call: dict[int, dict[int, _Copy]] = {}
    for pack in sorted(sent.packs):
        storage, index = trace.pack_storage[pack], trace.pack_instance[pack]
        fresh = fresh_of.get(pack)
        released = trace.pack_released[pack]
        asked = trace.storage_made[fresh] if fresh is not None else (trace.ops if released is None else released)
        done = (trace.storage_last[fresh] if fresh is not None else released - 1 if released is not None else None)
        done = trace.ops - 1 if done is None else done
        part = trace.storage_part[fresh] if fresh is not None else ACTIVATIONS
        _join(by_call.setdefault(index, {}), _Copy(storage, trace.pack_nbytes[pack], part, asked, done))
    for index, position in sorted(sent.inputs):
        instance = trace.instances[index]
        if instance.backward is None:
            continue
        storage = instance.inputs[position]
        ended = trace.backward_ends.get(index, instance.backward)
        copy = _Copy(storage, instance.inputs_nbytes[position], trace.storage_part[storage], instance.backward,
                     ended - 1)
        _join(by_call.setdefault(index, {}), copy)
    return {index: list(copies.values()) for index, copies in by_call.items()}


def _join(copies: dict[int, _Copy], copy: _Copy) -> None:
    """`copy` into its call's copies: a storage sent once, asked first by its first view, let go with its last."""
    known = copies.get(copy.storage)
    if known is None:
        copies[copy.storage] = copy
    else:
        known.asked, known.done = min(known.asked, copy.asked), max(known.done, copy.done)
