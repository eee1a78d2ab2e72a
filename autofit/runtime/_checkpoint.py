"""Activation checkpointing of one block, full or selective (`apply_checkpoint`, shaped like
torchtitan's apply_* functions): PyTorch's non-reentrant checkpoint, with selective checkpointing's
policy (`create_selective_checkpoint_contexts`) when only the cheap ops are to be recomputed; and the
offload of what a block saves for backward to host memory (`offload_block`: autofit.runtime._offload's
`ActivationOffload`, copies on a side stream that overlap the compute)."""

from __future__ import annotations

import functools
from contextlib import nullcontext
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from autofit.config import check_checkpoint_policy
from autofit.runtime._offload import offload_for

#: The compute-intensive ops whose outputs selective checkpointing saves (torchtitan's "op" AC, all
#: of them): recomputing them is most of the forward's cost, and what they return is a small share of
#: a block's activations. The rest (norms, activations, dropout, casts, reshapes) is recomputed.
#: Named, not referenced, because a build may lack some (the attention kernels, _scaled_mm).
_SAVED_OPS = ("mm", "addmm", "bmm", "baddbmm", "linear", "convolution", "_scaled_mm",
              "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
              "_scaled_dot_product_fused_attention_overrideable")


@functools.cache
def saved_ops() -> frozenset:
    """The ops (overloads) whose outputs selective checkpointing keeps, as this build has them."""
    ops = set()
    for name in _SAVED_OPS:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            ops.update(getattr(packet, overload) for overload in packet.overloads())
    return frozenset(ops)


def _save_compute_intensive(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in saved_ops() else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts() -> tuple[Any, Any]:
    return create_selective_checkpoint_contexts(_save_compute_intensive)


class CheckpointedForward:
    """A block's forward under activation checkpointing, its saved tensors offloaded to the host, or both,
    put in place of `block.forward`.

    An object that holds its block, not a closure over it: `copy.deepcopy` and `pickle` copy the
    block it names along with the block, so an EMA or teacher copy of a checkpointed model computes
    with its own weights (a closure kept the original's bound forward, and the copy silently trained
    against the live model). The state-dict keys, the module tree and `type(block)` are unchanged.

    The offload is outside the checkpoint: the innermost saved-tensor hooks take a tensor, so inside it
    the offload would take the tensors the checkpoint drops and recomputes. Outside, a checkpointed block
    offloads the inputs it keeps, and its recomputation in backward runs on the device, a block at a time."""

    def __init__(self, block: torch.nn.Module, inner: Any, policy: str | None, offload_to: str | None = None) -> None:
        self.block = block
        self.inner = inner
        """The forward it replaced when the instance had its own (another wrapper); None: the class's."""
        self.policy = policy
        """"full" or "selective"; None: the block is not checkpointed (its saved tensors offloaded only)."""
        self.offload_to = offload_to
        """The device type whose saved tensors go to pinned host memory ("cuda"); None: no offload."""

    @property
    def __wrapped__(self) -> Any:  # inspect.signature(block.forward) gives the real signature
        return self.inner if self.inner is not None else type(self.block).forward.__get__(self.block)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Looked up when called: the run's offload (its streams are no part of the block, which copies and
        # pickles as it is); under the memory estimator, one that keeps a CUDA target's host copies' shapes.
        offload = nullcontext() if self.offload_to is None else offload_for(self.offload_to).group(self.block)
        with offload:
            if self.policy is None:
                return self.__wrapped__(*args, **kwargs)
            context = {"context_fn": _selective_contexts} if self.policy == "selective" else {}
            return checkpoint(self.__wrapped__, *args, use_reentrant=False, **context, **kwargs)


def _installed(block: torch.nn.Module) -> CheckpointedForward | None:
    forward = block.__dict__.get("forward")
    return forward if isinstance(forward, CheckpointedForward) else None


def checkpoint_policy_of(block: torch.nn.Module) -> str | None:
    """The policy `block` is checkpointed under ("full", "selective"), or None when it is not."""
    installed = _installed(block)
    return installed.policy if installed is not None else None


def offloaded_to(block: torch.nn.Module) -> str | None:
    """The device type whose saved tensors `block` keeps in host memory ("cuda"), or None when it keeps them
    where they are."""
    installed = _installed(block)
    return installed.offload_to if installed is not None else None


def _wrapped(block: torch.nn.Module, policy: str | None, offload_to: str | None) -> torch.nn.Module:
    """`block` with its forward under `policy` and `offload_to`; its own forward again when neither."""
    installed = _installed(block)
    if installed is None and (policy is not None or offload_to is not None):
        block.forward = CheckpointedForward(block, block.__dict__.get("forward"), policy, offload_to)
    elif installed is not None and policy is None and offload_to is None:
        if installed.inner is None:
            del block.forward  # the class's own forward again
        else:
            block.forward = installed.inner
    elif installed is not None:
        installed.policy, installed.offload_to = policy, offload_to
    return block


def apply_checkpoint(block: torch.nn.Module, policy: str = "full") -> torch.nn.Module:
    """Make `block` recompute its activations in backward, in place: all of them ("full"), or all
    but the outputs of matmuls, convolutions and attention ("selective"). Idempotent; applied again
    with another policy, the policy changes. The module keeps its names and state-dict keys."""
    check_checkpoint_policy(policy)
    return _wrapped(block, policy, offloaded_to(block))


def remove_checkpoint(block: torch.nn.Module) -> torch.nn.Module:
    """Undo `apply_checkpoint` on `block`, in place (nothing to do on a block it never wrapped)."""
    return _wrapped(block, None, offloaded_to(block))


def offload_block(block: torch.nn.Module, device_type: str | None) -> torch.nn.Module:
    """Keep what `block` saves for backward on `device_type` ("cuda") in pinned host memory, in place (the run's
    `ActivationOffload`: copied out in forward beside the compute, back a block ahead in backward); None: where it
    is (the offload undone)."""
    return _wrapped(block, checkpoint_policy_of(block), device_type)
