"""Which blocks of a framework's model the checkpoint knob applies to."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def checkpointable_blocks(model: torch.nn.Module) -> Sequence[torch.nn.Module]:
    """The model's repeated layers: its longest ModuleList of one module type (GPT-2's `h`, Llama's
    `layers`)."""
    best: Sequence[torch.nn.Module] = ()
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > len(best):
            if len({type(block) for block in module}) == 1:
                best = module
    return best
