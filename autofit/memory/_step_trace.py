"""One traced step: the user's function run on fake tensors as `estimate_one` runs it, with a record of every
tensor's life (`StepTrace`), from which the peak of every config of its program is arithmetic
(autofit.memory._traced_peaks: micro-batch, checkpointed blocks and policy, activation offload).

What it records, op by op (MemTracker's own grain: it takes its peak after each dispatched op):
- the bytes alive after each op, by part (MemTracker's categories);
- each storage MemTracker follows: its bytes, its part, the op that made it, the last op it was alive after;
- each tensor autograd saves for backward (a saved-tensors hook): its storage, when, inside which forward of
  a block offered to `run.checkpoint()`, and when autograd let it go;
- each forward of an offered block (an instance): its first and last op, when its backward began (the first
  gradient of its outputs), its inputs, and the outputs of the ops selective checkpointing keeps
  (autofit.runtime's `saved_ops`).

Autograd holds nothing it saves while tracing: the hook keeps the tensor's shape and backward gets a new tensor
of it (as an offload of saved tensors to the host gives one back). So the trace shows each tensor's *natural* life, while
anything but autograd holds it, and when autograd would let it go; holding (no checkpointing), dropping and
recomputing (checkpointing) or copying to the host (offload) are then intervals added to it or taken from it.

Written here rather than taken from PyTorch's SACEstimator: that one reports, per module, each op's output
bytes and which of them autograd saves, but not when any of them is freed (a peak needs the timeline), it
holds every saved tensor (its hook returns the tensor), and it times every op on a roofline model, which an
estimate does not need. MemTracker does the storage bookkeeping here (categories, a storage's end).
"""

from __future__ import annotations

import zlib
from typing import Any

import torch
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.utils._pytree import tree_flatten

from autofit.memory._estimator import PARTS
from autofit.memory._trace_data import PART_OF, PARAMETERS, Instance, StepTrace
from autofit.runtime import MIN_OFFLOAD_BYTES, made_by_forward, saved_ops

class _Saved:
    """What autograd keeps of a saved tensor while tracing: its shape, never its storage."""

    __slots__ = ("index", "size", "stride", "dtype", "device", "trace", "recorder")

    def __init__(self, index: int, tensor: torch.Tensor, recorder: StepRecorder) -> None:
        self.index = index
        self.size, self.stride = tensor.size(), tensor.stride()
        self.dtype, self.device = tensor.dtype, tensor.device
        self.recorder = recorder

    def __del__(self) -> None:  # autograd let it go (the node ran, or its graph was freed)
        recorder = self.recorder
        recorder.trace.pack_released[self.index] = recorder.tracker.op


class StepRecorder:
    """The trace of one run of the function: its tracker (a MemTracker that keeps the timeline), the
    saved-tensors hooks and the offered blocks' hooks. Enter `recording()` around the function."""

    def __init__(self, tracker_class: type) -> None:
        self.trace = StepTrace(size=0, offload_min_bytes=MIN_OFFLOAD_BYTES)
        self.tracker = tracker_class(self)
        self._handles: list[Any] = []
        self._stack: list[int | None] = []  # the instances whose forward is running (None: one under no_grad)
        self._block_of: dict[int, int] = {}

    # --- storages (called by the tracker) ------------------------------------------------------------
    def storage(self, winfo: Any) -> int:
        """The index of the storage `winfo` follows, made now if new."""
        index = getattr(winfo, "_autofit_index", None)
        if index is None:
            trace = self.trace
            index = winfo._autofit_index = len(trace.storage_bytes)
            trace.storage_bytes.append(int(winfo.mem_consumed))
            trace.storage_part.append(PART_OF.get(getattr(winfo.reftype, "name", ""), 5))
            trace.storage_made.append(self.tracker.op)
            trace.storage_last.append(None)
        return index

    def freed(self, winfo: Any) -> None:
        index = getattr(winfo, "_autofit_index", None)
        if index is not None:
            self.trace.storage_last[index] = self.tracker.op - 1

    def index_of(self, tensor: torch.Tensor) -> int:
        """The followed storage of `tensor` (-1: none)."""
        for storage in get_untyped_storages(tensor):
            winfo, _ = self.tracker._WINFO.get(storage, (None, None))
            if winfo is not None:
                return self.storage(winfo)
        return -1

    def op_done(self, func: Any, out: Any) -> None:
        """After each op: its name into the signature; a saved op's outputs kept by the running instance."""
        self.trace.signature = zlib.crc32(str(func).encode(), self.trace.signature)
        if self._stack and self._stack[-1] is not None and func in self._saved_ops:
            kept = self.trace.instances[self._stack[-1]].kept
            for tensor in tree_flatten(out)[0]:
                if isinstance(tensor, torch.Tensor) and (index := self.index_of(tensor)) >= 0 and index not in kept:
                    kept.append(index)

    # --- saved tensors ---------------------------------------------------------------------------------
    def _pack(self, tensor: torch.Tensor) -> _Saved:
        trace = self.trace
        index = len(trace.pack_storage)
        storage = self.index_of(tensor)
        trace.pack_storage.append(storage)
        trace.pack_at.append(self.tracker.op)
        trace.pack_instance.append(self._stack[-1] if self._stack and not self.tracker.in_backward else None)
        trace.pack_released.append(None)
        trace.pack_movable.append(storage >= 0 and trace.storage_part[storage] != PARAMETERS
                                  and made_by_forward(tensor))
        trace.pack_nbytes.append(tensor.untyped_storage().nbytes())
        return _Saved(index, tensor, self)

    def _unpack(self, saved: _Saved) -> torch.Tensor:
        fresh = torch.empty_strided(saved.size, saved.stride, dtype=saved.dtype, device=saved.device)
        index = self.index_of(fresh)
        if index >= 0:
            self.trace.fresh[index] = saved.index
        return fresh

    # --- the offered blocks ----------------------------------------------------------------------------
    def offered(self, blocks: Any) -> None:
        """`RunHooks.blocks_offered`: follow each block's forward (and through it, its backward)."""
        self.trace.blocks = len(blocks)
        for index, block in enumerate(blocks):
            if id(block) in self._block_of:
                continue
            self._block_of[id(block)] = index
            self._handles.append(block.register_forward_pre_hook(self._forward_begins, with_kwargs=True))
            self._handles.append(block.register_forward_hook(self._forward_ends))

    def _forward_begins(self, block: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if not torch.is_grad_enabled() or self.tracker.in_backward:
            self._stack.append(None)
            return
        if any(i is not None for i in self._stack):
            self.trace.irregular = "a block offered to run.checkpoint() runs inside another"
        instance = Instance(self._block_of[id(block)], self.tracker.op)
        for tensor in tree_flatten((args, kwargs))[0]:
            if isinstance(tensor, torch.Tensor) and (storage := self.index_of(tensor)) >= 0:
                instance.inputs.append(storage)
                instance.inputs_movable.append(self.trace.storage_part[storage] != PARAMETERS
                                               and made_by_forward(tensor))
                instance.inputs_nbytes.append(tensor.untyped_storage().nbytes())
        self.trace.instances.append(instance)
        self._stack.append(len(self.trace.instances) - 1)

    def _forward_ends(self, block: torch.nn.Module, args: Any, output: Any) -> None:
        index = self._stack.pop() if self._stack else None
        if index is None:
            return
        instance = self.trace.instances[index]
        instance.last = self.tracker.op - 1
        outputs = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        if outputs:
            def began(_: Any) -> None:
                if instance.backward is None:
                    instance.backward = self.tracker.op

            torch.autograd.graph.register_multi_grad_hook(outputs, began, mode="any")

    # --- the whole ------------------------------------------------------------------------------------
    def recording(self) -> torch.autograd.graph.saved_tensors_hooks:
        """The saved-tensors hooks; enter them around the function, inside the tracker."""

        self._saved_ops = saved_ops()
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def finish(self, size: int) -> StepTrace:
        """The trace, its hooks removed; `size`: the samples of the micro-batch it ran."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.trace.size = size
        return self.trace


def trace_tracker_class(base: type) -> type:
    """`base` (autofit's StepTracker, a MemTracker) keeping a StepRecorder's timeline and storages."""

    class TraceTracker(base):
        def __init__(self, recorder: StepRecorder) -> None:
            super().__init__()
            self.recorder = recorder
            self.op = 0

        @property
        def in_backward(self) -> bool:
            return self._mod_tracker.is_bw

        def _update_peak_stats(self, peak_state: Any) -> None:
            super()._update_peak_stats(peak_state)
            row = [0] * len(PARTS)
            for per_device in self._curr_mem_snap.values():
                for key, value in per_device.items():
                    part = PART_OF.get(getattr(key, "name", ""))
                    if part is not None:
                        row[part] += value
            self.recorder.trace.rows.append(tuple(row))
            self.op += 1

        def _update_and_maybe_create_winfos(self, t: Any, reftype: Any, update_existing: bool = False) -> Any:
            winfos = super()._update_and_maybe_create_winfos(t, reftype, update_existing)
            for winfo in winfos:
                self.recorder.storage(winfo)
            return winfos

        def _track(self, reftype: Any, t: Any) -> None:
            super()._track(reftype, t)
            for storage in get_untyped_storages(t):
                winfo, _ = self._WINFO.get(storage, (None, None))
                if winfo is not None:
                    self.recorder.storage(winfo)

        def _delete_callback(self, winfo: Any, w_st: Any) -> None:
            super()._delete_callback(winfo, w_st)
            self.recorder.freed(winfo)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            before = self.op
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if self.op != before:  # a tracked op (not the data's, read for real)
                self.recorder.op_done(func, out)
            return out

    return TraceTracker
