"""`Run`: what a training function sees. It carries one config and counts what the function does."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint as _torch_checkpoint

from autofit.precision import make_grad_scaler, precision_context
from autofit.space import Config


class ProbeFinished(BaseException):
    """Raised out of `run.batches()` once a probe has its steps.

    A BaseException, so that a user's `except Exception` around the loop does not swallow it.
    """


@dataclass
class Knobs:
    """Which settings the function actually used, so the search spends no probes on the others."""

    autocast: bool = False
    backward: bool = False
    checkpoint_blocks: int | None = None  # blocks offered to run.checkpoint(); None = never called
    batches: bool = False

    def to_dict(self) -> dict:
        return {
            "autocast": self.autocast,
            "backward": self.backward,
            "checkpoint_blocks": self.checkpoint_blocks,
            "batches": self.batches,
        }


@dataclass
class StepClock:
    """Timestamps at optimizer-step boundaries, taken with the device synchronised."""

    warmup_steps: int
    measured_steps: int | None  # None: no probe, train until the function returns
    synchronize: Callable[[], None]
    boundaries: list[float] = field(default_factory=list)  # time at the end of each step
    samples_per_step: list[int] = field(default_factory=list)
    tokens_per_step: list[int] = field(default_factory=list)

    @property
    def total_steps(self) -> int | None:
        if self.measured_steps is None:
            return None
        return self.warmup_steps + self.measured_steps

    def start(self) -> None:
        self.synchronize()  # a CPU-GPU sync point: the step's kernels must be done
        self.boundaries.append(time.perf_counter())

    def step_done(self, samples: int, tokens: int) -> None:
        self.synchronize()  # a CPU-GPU sync point
        self.boundaries.append(time.perf_counter())
        self.samples_per_step.append(samples)
        self.tokens_per_step.append(tokens)

    @property
    def steps_done(self) -> int:
        return len(self.samples_per_step)

    def measured(self) -> tuple[list[float], int, int]:
        """Step times, samples and tokens of the steps after warm-up."""
        w = self.warmup_steps
        times = [b - a for a, b in zip(self.boundaries[w:], self.boundaries[w + 1 :])]
        return times, sum(self.samples_per_step[w:]), sum(self.tokens_per_step[w:])


class Run:
    """One training run under one `Config`: a probe of a few steps, or the real thing."""

    def __init__(
        self,
        config: Config,
        device: torch.device | str = "cpu",
        *,
        probing: bool = False,
        warmup_steps: int = 0,
        measured_steps: int | None = None,
        synchronize: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self._device = torch.device(device)
        self._probing = probing
        self.knobs = Knobs()
        self.clock = StepClock(warmup_steps, measured_steps, synchronize or (lambda: None))
        self._scaler = make_grad_scaler(config.precision, self._device)
        self._micro_batches = 0  # handed out by batches()
        self._backwards = 0  # run.backward() calls
        self._step_samples = 0
        self._step_tokens = 0
        self.losses: list[torch.Tensor] = []  # detached loss of each optimizer step, checked later

    # --- the settings -------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """Micro-batch size: give it to your DataLoader."""
        return self.config.batch_size

    @property
    def accumulation_steps(self) -> int:
        return self.config.accumulation_steps

    @property
    def global_batch(self) -> int:
        return self.config.global_batch

    @property
    def precision(self) -> str:
        return self.config.precision

    @property
    def checkpoint_segments(self) -> int:
        return self.config.checkpoint_segments

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def probing(self) -> bool:
        """True inside a probe: skip evaluation, saving and logging that a probe does not need."""
        return self._probing

    @property
    def optimizer_steps(self) -> int:
        return self.clock.steps_done

    # --- the helpers --------------------------------------------------------------------------
    def autocast(self):
        """Context for the forward pass under the chosen precision (fp32: nothing changes)."""
        self.knobs.autocast = True
        return precision_context(self.config.precision, self._device)

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        """Backward with accumulation and fp16 loss scaling; steps and zeroes at step boundaries."""
        self.knobs.backward = True
        scaled = loss / self.config.accumulation_steps
        if self._scaler is not None:
            scaled = self._scaler.scale(scaled)
        scaled.backward()
        self._backwards += 1
        if self._backwards % self.config.accumulation_steps == 0:
            if self._scaler is not None:
                self._scaler.step(optimizer)
                self._scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            self.losses.append(loss.detach())

    def checkpoint(self, blocks: Sequence[torch.nn.Module]) -> Sequence[torch.nn.Module]:
        """Activation checkpointing on the first `checkpoint_segments` of `blocks`.

        Uses PyTorch's non-reentrant checkpoint; the modules keep their names and state-dict keys.
        """
        blocks = list(blocks) if not isinstance(blocks, torch.nn.ModuleList) else blocks
        self.knobs.checkpoint_blocks = len(blocks)
        for block in list(blocks)[: self.config.checkpoint_segments]:
            apply_checkpoint(block)
        return blocks

    def batches(
        self,
        iterable: Iterable[Any],
        *,
        tokens: int | Callable[[Any], int] | None = None,
    ) -> Iterator[Any]:
        """Yield micro-batches moved to the device; count samples, tokens and optimizer steps.

        `tokens`: tokens per sample (an int) or a function of the batch, for tokens/s.
        In a probe, the loop ends (via ProbeFinished) once the probe has its steps.
        """
        self.knobs.batches = True
        acc = self.config.accumulation_steps
        for batch in iterable:
            if self._micro_batches == 0:
                self.clock.start()
            elif self._micro_batches % acc == 0:
                self._finish_step()
            self._micro_batches += 1
            self._step_samples += _count_samples(batch)
            self._step_tokens += _count_tokens(batch, tokens)
            yield to_device(batch, self._device)
        if self._micro_batches and self._micro_batches % acc == 0 and self._step_samples:
            self._finish_step()  # the data ran out: the last step's work is done

    def _finish_step(self) -> None:
        self.clock.step_done(self._step_samples, self._step_tokens)
        self._step_samples = self._step_tokens = 0
        total = self.clock.total_steps
        if self._probing and total is not None and self.clock.steps_done >= total:
            raise ProbeFinished()

    def finish(self) -> None:
        """Close the last step when the function left its loop early (a `break`)."""
        if self._micro_batches and self._micro_batches % self.config.accumulation_steps == 0 and self._step_samples:
            self.clock.step_done(self._step_samples, self._step_tokens)
            self._step_samples = self._step_tokens = 0


def apply_checkpoint(block: torch.nn.Module) -> torch.nn.Module:
    """Make `block` recompute its activations in backward, in place (idempotent)."""
    if getattr(block, "_autofit_checkpointed", False):
        return block
    forward = block.forward

    @functools.wraps(forward)
    def checkpointed_forward(*args: Any, **kwargs: Any) -> Any:
        return _torch_checkpoint(forward, *args, use_reentrant=False, **kwargs)

    block.forward = checkpointed_forward
    block._autofit_checkpointed = True
    return block


def to_device(batch: Any, device: torch.device) -> Any:
    """Move tensors, and tensors inside tuples, lists and dicts, to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return type(batch)({k: to_device(v, device) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def _first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(values, (list, tuple)) or isinstance(batch, Mapping):
        for value in values:
            found = _first_tensor(value)
            if found is not None:
                return found
    return None


def _count_samples(batch: Any) -> int:
    tensor = _first_tensor(batch)
    return int(tensor.shape[0]) if tensor is not None and tensor.dim() > 0 else 1


def _count_tokens(batch: Any, tokens: int | Callable[[Any], int] | None) -> int:
    if tokens is None:
        return 0
    if callable(tokens):
        return int(tokens(batch))
    return int(tokens) * _count_samples(batch)
