"""Activation checkpointing of one block, full or selective (`apply_checkpoint`, shaped like
torchtitan's apply_* functions): PyTorch's non-reentrant checkpoint, with selective checkpointing's
policy (`create_selective_checkpoint_contexts`) when only the cheap ops are to be recomputed."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from autofit.config import check_checkpoint_policy

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


def apply_checkpoint(block: torch.nn.Module, policy: str = "full") -> torch.nn.Module:
    """Make `block` recompute its activations in backward, in place: all of them ("full"), or all
    but the outputs of matmuls, convolutions and attention ("selective"). Idempotent; applied again
    with another policy, the policy changes. The module keeps its names and state-dict keys."""
    check_checkpoint_policy(policy)
    if getattr(block, "_autofit_checkpoint_policy", None) == policy:
        return block
    forward = getattr(block, "_autofit_forward", None) or block.forward
    context = {"context_fn": _selective_contexts} if policy == "selective" else {}

    @functools.wraps(forward)
    def checkpointed_forward(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **context, **kwargs)

    block._autofit_forward = forward
    block.forward = checkpointed_forward
    block._autofit_checkpointed = True
    block._autofit_checkpoint_policy = policy
    return block


def remove_checkpoint(block: torch.nn.Module) -> torch.nn.Module:
    """Undo `apply_checkpoint` on `block`, in place (nothing to do on a block it never wrapped)."""
    if not getattr(block, "_autofit_checkpointed", False):
        return block
    if block._autofit_forward == type(block).forward.__get__(block):
        del block.forward  # the class's own forward again
    else:
        block.forward = block._autofit_forward
    del block._autofit_checkpointed, block._autofit_forward, block._autofit_checkpoint_policy
    return block
