"""Precision as data: what each name means for autocast, TF32 and loss scaling.

A precision holds for the whole training run, not only the forward pass: `precision_scope` sets
how float32 matmuls, convolutions and RNNs run on CUDA (forward, backward and the optimizer step)
and restores the process's settings afterwards; `precision_context` is the autocast context of the
forward pass alone.

    fp32  full IEEE float32 everywhere (cuDNN convolutions too, which PyTorch runs in TF32 by default)
    tf32  float32 tensors, TF32 tensor-core matmuls and convolutions (CUDA, compute capability >= 8.0)
    bf16  autocast to bfloat16; what stays float32 runs in IEEE float32
    fp16  autocast to float16 with a GradScaler; what stays float32 runs in IEEE float32
"""

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

#: The per-backend float32 precision switches of PyTorch's current API (torch >= 2.9).
_FP32_SWITCHES = (
    ("cuda", "matmul"),
    ("cudnn", "conv"),
    ("cudnn", "rnn"),
)


def _new_api_available() -> bool:
    return hasattr(torch.backends.cuda.matmul, "fp32_precision")


def _switch(backend: str, op: str):
    return getattr(getattr(torch.backends, backend), op)


@contextmanager
def tf32_scope(enabled: bool) -> Iterator[None]:
    """Float32 matmuls, convolutions and RNNs on CUDA in TF32 (or IEEE) inside the block, restored after.

    Uses the `fp32_precision` API where it exists: a script that set it and then reads a legacy
    `allow_tf32` flag gets a RuntimeError from PyTorch, so autofit never touches the legacy flags there.
    """
    if _new_api_available():
        value = "tf32" if enabled else "ieee"
        previous = [_switch(backend, op).fp32_precision for backend, op in _FP32_SWITCHES]
        try:
            for backend, op in _FP32_SWITCHES:
                _switch(backend, op).fp32_precision = value
            yield
        finally:
            for (backend, op), old in zip(_FP32_SWITCHES, previous):
                _switch(backend, op).fp32_precision = old
        return
    previous_legacy = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous_legacy


def tf32_matmuls() -> bool:
    """Whether float32 matmuls on CUDA run in TF32 now (the script may have turned it on itself, as
    nanoGPT does: `torch.backends.cuda.matmul.allow_tf32 = True`)."""
    try:
        if _new_api_available():
            return torch.backends.cuda.matmul.fp32_precision == "tf32"
        return bool(torch.backends.cuda.matmul.allow_tf32)
    except RuntimeError:  # this build refuses to read it
        return False


def forces_tf32(name: str, device: torch.device) -> bool:
    """Inside a run's precision scope: whether the function turned TF32 on for float32 matmuls itself where
    precision `name` keeps them IEEE. Its fp32 then runs TF32 math: the peak its MFU is measured against is
    TF32's, and a search tries one of fp32 and tf32, not both."""
    return torch.device(device).type == "cuda" and not MODES[name].tf32 and tf32_matmuls()


def precision_scope(name: str, device: torch.device):
    """The context a whole run (forward, backward, optimizer) runs under for precision `name`.

    On CUDA it fixes TF32 on or off; elsewhere there is nothing to set.
    """
    if torch.device(device).type != "cuda":
        return nullcontext()
    return tf32_scope(MODES[name].tf32)


def precision_context(name: str, device: torch.device):
    """The autocast context a forward pass runs under for precision `name` (fp32/tf32: none)."""
    mode = MODES[name]
    if mode.autocast_dtype is not None:
        return torch.autocast(device_type=torch.device(device).type, dtype=mode.autocast_dtype)
    return nullcontext()


def make_grad_scaler(name: str, device: torch.device) -> torch.amp.GradScaler | None:
    """A GradScaler only for fp16: bf16 has fp32's range and needs none."""
    if not MODES[name].loss_scaling:
        return None
    return torch.amp.GradScaler(torch.device(device).type)
