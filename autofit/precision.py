"""Precision as data: what each name means for autocast, TF32 and loss scaling."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PrecisionMode:
    autocast_dtype: torch.dtype | None
    tf32: bool
    loss_scaling: bool


MODES: dict[str, PrecisionMode] = {
    "fp32": PrecisionMode(autocast_dtype=None, tf32=False, loss_scaling=False),
    "tf32": PrecisionMode(autocast_dtype=None, tf32=True, loss_scaling=False),
    "bf16": PrecisionMode(autocast_dtype=torch.bfloat16, tf32=False, loss_scaling=False),
    "fp16": PrecisionMode(autocast_dtype=torch.float16, tf32=False, loss_scaling=True),
}


@contextmanager
def _tf32_matmuls(enabled: bool) -> Iterator[None]:
    """TF32 for matmuls and convolutions inside the block, restored after it."""
    previous = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous


def precision_context(name: str, device: torch.device):
    """The context a forward pass runs under for precision `name` on `device`."""
    mode = MODES[name]
    if mode.autocast_dtype is not None:
        return torch.autocast(device_type=device.type, dtype=mode.autocast_dtype)
    if mode.tf32 and device.type == "cuda":
        return _tf32_matmuls(True)
    if device.type == "cuda":
        return _tf32_matmuls(False)  # fp32 means full fp32, whatever the process default is
    return nullcontext()


def make_grad_scaler(name: str, device: torch.device) -> torch.amp.GradScaler | None:
    """A GradScaler only for fp16: bf16 has fp32's range and needs none."""
    if not MODES[name].loss_scaling:
        return None
    return torch.amp.GradScaler(device.type)
