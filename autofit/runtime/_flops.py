"""Model FLOPs of one training step, counted with PyTorch's own FLOP formulas.

A probe counts one optimizer step taken after its measured steps (never timed: the counter's dispatch
costs Python time on every op, and a step counted first made the measured steps after it 7% slower on
a CPU, interleaved through autofit's worker). What is counted are *model* FLOPs, the numerator of MFU: forward,
backward and optimizer, not the forward that activation checkpointing runs again in backward (that
would be hardware FLOPs, HFU, and would make checkpointing look like better utilisation). The
counter does not see that recompute (torch 2.13: the checkpoint's unpack hook runs it outside the
mode), which tests/whitebox/test_probe_in_process.py holds it to.

The counting is PyTorch's: its per-op formulas (`torch.utils.flop_counter.flop_registry`, what
FlopCounterMode sums), applied by a dispatch mode of our own. FlopCounterMode itself cannot be
used in a probe: its module tracker's hooks keep a checkpointed block's recomputed activations alive
in backward, and the counted step then set the probe's peak (a fully checkpointed studies/gpt.py
probe: 1,217 MiB counted against 832 MiB not; benchmarks/checkpoint-policy.md).

Not counted (None): compiled configs (the counter cannot see inside an inductor graph, and the
model FLOPs are the eager ones anyway: a search takes them from an eager probe) and sharded
(FSDP2) configs, whose DTensors would be counted at their global shapes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode


class FlopCount(TorchDispatchMode):
    """Sums PyTorch's FLOP formulas over the ops that run under it; holds no tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_counter.flop_registry.get(func._overloadpacket)
        if formula is not None:
            try:
                self.total += int(formula(*args, **kwargs, out_val=out))
            except Exception:  # noqa: BLE001 - it runs inside the user's op: a formula that fails counts 0
                pass
        return out


class StepFlops:
    """Counts the FLOPs of one step: `begin()` when the step starts, `end(samples)` when it closes."""

    def __init__(self) -> None:
        self._mode: Any = None
        self.flops: int | None = None
        self.samples = 0
        self.tokens = 0
        """The counted step's real (non-padding) tokens, where its batches count them (0: not counted)."""
        self.failure: str | None = None
        """Why nothing was counted (the counter could not start or stop), for the probe's notes."""

    @property
    def counting(self) -> bool:
        return self._mode is not None

    def begin(self) -> None:
        try:
            _count_cpu_attention()
            mode = FlopCount()
            mode.__enter__()
        except Exception as error:  # noqa: BLE001 - counting is a nicety; the probe goes on
            self.failure = f"FLOPs not counted ({type(error).__name__}: {error})"
            return
        self._mode = mode

    def end(self, samples: int, tokens: int = 0) -> None:
        """Close the counted step of `samples` samples (and `tokens` real tokens, where counted)."""
        mode, self._mode = self._mode, None
        if mode is None:
            return
        try:
            mode.__exit__(None, None, None)
        except Exception as error:  # noqa: BLE001
            self.failure = f"FLOPs not counted ({type(error).__name__}: {error})"
            return
        self.flops = mode.total
        self.samples, self.tokens = samples, tokens

    def abandon(self) -> None:
        """The step did not finish (an exception left it): stop counting, keep nothing."""
        mode, self._mode = self._mode, None
        if mode is not None:
            try:
                mode.__exit__(None, None, None)
            except Exception:  # noqa: BLE001
                pass

    @property
    def per_sample(self) -> float | None:
        """Model FLOPs per sample of the counted step (None when nothing was counted)."""
        if not self.flops or not self.samples:
            return None
        return self.flops / self.samples

    @property
    def per_token(self) -> float | None:
        """Model FLOPs per real token of the counted step (None where its tokens were not counted): by
        tokens a micro-batch holds as many samples as fit, so FLOPs per sample vary with the lengths drawn
        far more than FLOPs per token do."""
        if not self.flops or not self.tokens:
            return None
        return self.flops / self.tokens


_cpu_attention_counted = False


def _count_cpu_attention() -> None:
    """Give the CPU's fused attention kernels the formulas PyTorch has for the CUDA ones.

    PyTorch registers FLOP formulas for the flash, efficient and cuDNN attention kernels but not for
    `_scaled_dot_product_flash_attention_for_cpu` (torch 2.13), so on a CPU every
    `F.scaled_dot_product_attention` would count as zero FLOPs. The arguments lead with the same
    tensors (query, key, value; backward: grad_out, query, key, value), so the same formulas apply.
    """
    global _cpu_attention_counted
    if _cpu_attention_counted:
        return
    _cpu_attention_counted = True
    aten = torch.ops.aten
    pairs = (("_scaled_dot_product_flash_attention_for_cpu", flop_counter.sdpa_flop),
             ("_scaled_dot_product_flash_attention_for_cpu_backward", flop_counter.sdpa_backward_flop))
    for name, formula in pairs:
        op = getattr(aten, name, None)
        if op is not None and op not in flop_counter.flop_registry:
            # get_raw: the public formulas are already wrapped to take shapes.
            flop_counter.register_flop_formula(op, get_raw=True)(formula)
