"""The peak of a config from two traces of its program at two micro-batches (autofit.memory._step_trace): the
traced timeline changed by what the config does to the blocks offered to `run.checkpoint()` (the runtime's
own plan of them, `block_plan`), no run of the config itself: arithmetic over plain lists.

A trace shows each tensor's natural life (what holds it but autograd) and when autograd lets each saved tensor
go. A config's bytes after each op are the trace's, with:
- every tensor autograd saved held from its natural end until autograd lets it go (no checkpointing);
- in a checkpointed block (the first `checkpoint_segments` of them), what its forward made and saved dropped until its
  backward begins, then held again (the recompute makes it anew), and at that moment the forward's passing
  bytes above what it keeps (the recompute's temporaries); its inputs held until its backward ends (the
  checkpoint saves them); under the selective policy, the outputs of the ops it keeps (autofit.runtime's
  `saved_ops`) held from their end to its backward (PyTorch's policy caches them) and through it as saved;
- in an offloaded block, what autofit's activation offload sends held on the device until the next block's
  forward ends and back on it from its backward's first ask (or the block after it's: the prefetch) until
  autograd lets it go (autofit.memory._traced_offload: which tensors leave, at which sizes, and when);
- the tensors backward got in place of the saved ones (the trace's own) taken out.
Everything is affine in the micro-batch (a tensor's bytes are a + b x samples), so the bytes after each op
at any size are the two traces' interpolated, and the peak is their largest; but for the offload, which sends
only storages of autofit.runtime's `MIN_OFFLOAD_BYTES` or more: which those are is decided at the size asked,
and both traces' timelines are made with that choice.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from autofit.memory._trace_data import ACTIVATIONS, PARTS, Instance, StepTrace
from autofit.memory._traced_offload import Sent, offloaded

#: How a config keeps a saved tensor: held by autograd, dropped and recomputed, sent to the host by the offload,
#: or not at all (a checkpointed block's input the offload sends: the checkpoint's saved input stands for it).
_HELD, _RECOMPUTED, _OFFLOADED, _ELSEWHERE = range(4)


@dataclass(frozen=True)
class Layout:
    """What a config does to the blocks offered to run.checkpoint(), block by block, as the runtime applies it
    (autofit.runtime's `block_plan`): each one's checkpoint policy (None: not checkpointed) and whether what it
    saves goes to the host."""

    plans: tuple[tuple[str | None, bool], ...] = ()

    @classmethod
    def of(cls, config, blocks: int) -> Layout:
        from autofit.runtime import block_plan

        plans = tuple(block_plan(config, blocks))
        return cls(plans if any(policy is not None or offloaded for policy, offloaded in plans) else ())

    @property
    def plain(self) -> bool:
        return not self.plans

    def policy(self, block: int) -> str | None:
        return self.plans[block][0] if block < len(self.plans) else None

    def offloaded(self, block: int) -> bool:
        """What the block saves goes to the host (a checkpointed one saves nothing but its inputs)."""
        return block < len(self.plans) and self.plans[block][1]


def timeline(trace: StepTrace, layout: Layout, sent: Sent = Sent()) -> list[list[int]]:
    """Bytes after each op under `layout`, the offload sending `sent`, by part: one list per part (PARTS' order)."""
    ops = trace.ops
    diff = [[0] * (ops + 1) for _ in PARTS]

    def add(part: int, start: int, end: int, amount: int) -> None:
        start, end = max(start, 0), min(end, ops - 1)
        if amount and start <= end:
            diff[part][start] += amount
            diff[part][end + 1] -= amount

    modes = [_mode(trace, layout, sent, p) for p in range(len(trace.pack_storage))]
    for storage in trace.fresh:  # backward's own: the saved tensor itself, the recompute's, or the offload's copy
        add(trace.storage_part[storage], trace.storage_made[storage], _last(trace, storage, ops),
            -trace.storage_bytes[storage])
    forward_end = offloaded(trace, sent, add)
    held, recomputed = _held(trace, modes, forward_end, ops, add)
    for index, instance in enumerate(trace.instances):
        if layout.policy(instance.block) is not None:
            _checkpointed(trace, layout, sent, index, held, recomputed, ops, add)
    out = []
    for part in range(len(PARTS)):
        running, column = 0, []
        for t in range(ops):
            running += diff[part][t]
            column.append(trace.rows[t][part] + running)
        out.append(column)
    return out


def _mode(trace: StepTrace, layout: Layout, sent: Sent, pack: int) -> int:
    """How the config keeps one saved tensor (`_HELD`...)."""
    index = trace.pack_instance[pack]
    if index is None:
        return _HELD
    instance = trace.instances[index]
    storage = trace.pack_storage[pack]
    policy = layout.policy(instance.block)
    if policy is not None:
        if storage < 0 or trace.storage_made[storage] < instance.first:
            if storage in sent.input_storages(trace, index):
                return _ELSEWHERE
            return _HELD  # its inputs (the checkpoint saves them), the parameters
        if policy == "selective" and storage in instance.kept:
            return _HELD  # selective checkpointing keeps it
        return _RECOMPUTED
    return _OFFLOADED if pack in sent.packs else _HELD


def _last(trace: StepTrace, storage: int, ops: int) -> int:
    last = trace.storage_last[storage]
    return ops - 1 if last is None else last


def _held(trace: StepTrace, modes: list[int], forward_end: dict[int, int], ops: int,
          add) -> tuple[dict[int, int], dict[int, int]]:
    """The saved tensors autograd holds (or the recompute holds anew, or the offload until it let them go): added
    past their natural end. Returns each held storage's last op held, and the bytes each checkpointed instance's
    recompute holds anew."""
    held: dict[int, int] = dict(forward_end)
    recomputed: dict[tuple[int, int], int] = {}
    for pack, storage in enumerate(trace.pack_storage):
        if storage < 0 or modes[pack] in (_OFFLOADED, _ELSEWHERE):
            continue
        released = trace.pack_released[pack]
        end = (ops if released is None else released) - 1
        if modes[pack] == _HELD:
            held[storage] = max(held.get(storage, -1), end)
        else:
            key = (storage, trace.pack_instance[pack])
            recomputed[key] = max(recomputed.get(key, -1), end)
    for storage, end in held.items():
        if trace.storage_last[storage] is not None:
            add(trace.storage_part[storage], trace.storage_last[storage] + 1, end, trace.storage_bytes[storage])
    anew: dict[int, int] = {}
    for (storage, index), end in recomputed.items():
        began = trace.instances[index].backward
        if began is not None:
            add(ACTIVATIONS, began, end, trace.storage_bytes[storage])
            anew[index] = anew.get(index, 0) + trace.storage_bytes[storage]
    return held, anew


def _checkpointed(trace: StepTrace, layout: Layout, sent: Sent, index: int, held: dict[int, int],
                  recomputed: dict[int, int], ops: int, add) -> None:
    """What a checkpointed block holds beside its recomputed tensors: its inputs, the outputs selective
    checkpointing keeps, and the recompute's passing bytes when its backward begins."""
    instance = trace.instances[index]
    began = instance.backward
    if began is None:
        return
    ended = trace.backward_ends.get(index, began)
    away = sent.input_storages(trace, index)  # to the host, and back for the recompute (the offload's)
    for storage in set(instance.inputs) - away:  # the checkpoint saves its inputs until its backward ends
        start = max(_last(trace, storage, ops), held.get(storage, -1)) + 1
        add(trace.storage_part[storage], start, ended - 1, trace.storage_bytes[storage])
    kept = set(instance.kept) if layout.policy(instance.block) == "selective" else set()
    for storage in kept:  # cached by the policy until the recompute takes it
        start = max(_last(trace, storage, ops), held.get(storage, -1)) + 1
        add(ACTIVATIONS, start, began - 1, trace.storage_bytes[storage])
    again = _forward_high(trace, instance, kept, ops) - recomputed.get(index, 0)
    add(ACTIVATIONS, began, began, max(0, again))  # the recompute's passing bytes above what it holds after


def _forward_high(trace: StepTrace, instance: Instance, kept: set[int], ops: int) -> int:
    """The most bytes alive at once during the block's forward (without checkpointing) of those it made
    itself, but `kept`: what its recompute makes again, at its height."""
    first, last = instance.first, instance.last
    if last < first:
        return 0
    made = trace.storage_made
    diff = [0] * (last - first + 2)
    for storage in range(bisect.bisect_left(made, first), bisect.bisect_right(made, last)):
        if storage in kept or storage in trace.fresh:
            continue
        end = min(max(_last(trace, storage, ops), trace.plain_end.get(storage, -1)), last)
        diff[made[storage] - first] += trace.storage_bytes[storage]
        diff[end - first + 1] -= trace.storage_bytes[storage]
    high = running = 0
    for step in diff[:-1]:
        running += step
        high = max(high, running)
    return high


def apart(small: StepTrace, large: StepTrace) -> str | None:
    """Why no arithmetic lies between two traces of one program (None: it does): they ran different ops (a branch
    on the size), or one size."""
    if small.ops != large.ops or small.signature != large.signature or len(small.pack_storage) != len(
            large.pack_storage):
        return f"the traces at {small.size} and {large.size} samples ran different ops"
    return "the two traces ran one size" if small.size == large.size else None


class TracedPeaks:
    """The peaks of one program's configs from its two traces (the same ops at two sizes)."""

    def __init__(self, small: StepTrace, large: StepTrace | None) -> None:
        """`large` None: every size runs `small`'s batch (by tokens, a data whose longest samples all fit the
        smallest cap); else two traces `apart` finds nothing between."""
        assert large is None or apart(small, large) is None, apart(small, large)
        self.small, self.large = small, large
        self._lines: dict[tuple[Layout, Sent], list[tuple[list[float], list[float]]]] = {}

    @classmethod
    def flat(cls, trace: StepTrace) -> TracedPeaks:
        return cls(trace, None)

    def layout(self, config) -> Layout:
        """What `config` does to the blocks the traced function offered."""
        return Layout.of(config, self.small.blocks)

    def describes(self, layout: Layout) -> str | None:
        """Why the arithmetic cannot give `layout`'s peak (None: it can)."""
        return None if layout.plain else self.small.irregular

    def breakdown(self, layout: Layout, size: float) -> dict[str, int]:
        """Predicted bytes by part at the peak of `layout` at `size` samples."""
        best, parts = None, None
        sent = Sent.at(self.small, self.large, layout, size) if any(layout.offloaded(b) for b in range(
            self.small.blocks)) else Sent()
        for at_zero, slope in self._candidates(layout, sent):
            total = sum(at_zero) + size * sum(slope)
            if best is None or total > best:
                best, parts = total, [max(0.0, a + size * s) for a, s in zip(at_zero, slope)]
        return {part: int(round(value)) for part, value in zip(PARTS, parts or [0] * len(PARTS))}

    def _candidates(self, layout: Layout, sent: Sent) -> list[tuple[list[float], list[float]]]:
        """The ops whose bytes can be the largest at some size >= 0 (by part: bytes at size 0, bytes a sample):
        those no other op beats both at size 0 and in its growth. The offload sending `sent` at both sizes."""
        if (layout, sent) not in self._lines:
            small = timeline(self.small, layout, sent)
            large = timeline(self.large, layout, sent) if self.large is not None else small
            span = self.large.size - self.small.size if self.large is not None else 1
            points = []
            for t in range(self.small.ops):
                slope = [(large[p][t] - small[p][t]) / span for p in range(len(PARTS))]
                at_zero = [small[p][t] - self.small.size * slope[p] for p in range(len(PARTS))]
                points.append((sum(at_zero), sum(slope), at_zero, slope))
            points.sort(key=lambda point: (-point[0], -point[1]))
            front, steepest = [], None
            for total, growth, at_zero, slope in points:
                if steepest is None or growth > steepest:
                    front.append((at_zero, slope))
                    steepest = growth
            self._lines[layout, sent] = front
        return self._lines[layout, sent]
