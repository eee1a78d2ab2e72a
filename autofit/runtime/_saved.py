"""`SavedTensors`: what a real run's forward passes save for backward, held where the run can let it go.

Why: a loop keeps its step's outputs in its own variables (`logits = model(x)`) until the next forward assigns
them again, and a tensor keeps its autograd graph, with every activation saved for backward. When a step runs
out of memory in its backward, that graph is still held through the loop's variable while the step is redone
at a smaller micro-batch: the redo ran out of memory again at every size down to 1 (a whole-epoch run by tokens,
issue 37), though a smaller micro-batch needs less. A forward under `run.autocast()` in a run that recovers
from OOMs saves its tensors through PyTorch's saved-tensor hooks into holders the run keeps weak references to;
after an OOM the run empties the holders of the failed step, so its activations go back to the device whoever
still holds the graph. Its backward, if anyone ran it, would say so."""

from __future__ import annotations

import weakref
from typing import Any

import torch


class _Held:
    """One saved tensor, until the run lets it go."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor: torch.Tensor | None = tensor


class SavedTensors:
    """The saved-for-backward tensors of the forward passes under `hooks()`, released at once by `release()`."""

    def __init__(self) -> None:
        self._held: list[weakref.ReferenceType[_Held]] = []

    def hooks(self) -> Any:
        """A context under which every tensor saved for backward is held here."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, tensor: torch.Tensor) -> _Held:
        held = _Held(tensor)
        if len(self._held) >= _PRUNE_AT:  # the backward of each micro-batch drops its graph: its holders die
            self._held = [ref for ref in self._held if ref() is not None]
        self._held.append(weakref.ref(held))
        return held

    def release(self) -> None:
        """Let every saved tensor still held go (a step that ran out of memory is being redone)."""
        for ref in self._held:
            held = ref()
            if held is not None:
                held.tensor = None
        self._held = []


def _unpack(held: _Held) -> torch.Tensor:
    if held.tensor is None:
        raise RuntimeError("autofit released this tensor: its step ran out of memory and was redone; a backward "
                           "through that step's graph has nothing to use")
    return held.tensor


#: Weak references kept before the dead ones are dropped (a forward saves hundreds of tensors).
_PRUNE_AT = 4096
