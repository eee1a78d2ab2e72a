"""`Run`: what a training function sees. It carries one config and counts what the function does."""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from autofit.config import Config
from autofit.runtime._batch import count_samples, split_batch, to_device
from autofit.runtime._checkpoint import apply_checkpoint, remove_checkpoint
from autofit.runtime._distributed import Ranks, agree_on_most
from autofit.runtime._flops import StepFlops
from autofit.runtime._loader import build_loader
from autofit.runtime._precision import make_grad_scaler, precision_context, precision_scope
from autofit.runtime._redo import Lowering, StepRedo, drop_graph


class ProbeFinished(BaseException):
    """Raised out of `run.batches()` once a probe has its steps.

    A BaseException, so that a user's `except Exception` around the loop does not swallow it.
    """


class DataTooSmall(RuntimeError):
    """A pass over the data yielded no batch at this batch size: it cannot be probed."""


@dataclass
class Knobs:
    """Which settings the function actually used, so the search spends no probes on the others."""

    autocast: bool = False
    backward: bool = False
    checkpoint_blocks: int | None = None  # blocks offered to run.checkpoint(); None = never called
    batches: bool = False
    shard_blocks: int | None = None  # blocks offered to run.distribute(blocks=...): sharding is searched
    compile: bool = False  # a model offered to run.compile(): torch.compile is searched
    loader: bool = False  # the data comes through run.loader(): its workers, pinning and prefetch are searched
    declared_workers: int | None = None  # declared to the training run.loader() (0: DataLoader's default)

    def to_dict(self) -> dict:
        return {
            "compile": self.compile,
            **({"loader": True, "declared_workers": self.declared_workers} if self.loader else {}),
            "autocast": self.autocast,
            "backward": self.backward,
            "checkpoint_blocks": self.checkpoint_blocks,
            "batches": self.batches,
            "shard_blocks": self.shard_blocks,
        }


#: Step times a run keeps for its median and spread; older ones only count in the totals.
_RECENT_STEPS = 256


@dataclass
class StepClock:
    """Step boundaries and what the steps after warm-up did, in constant memory.

    The device is synchronised only where a time must be exact: when measuring starts (end of
    warm-up) and when it ends. Steps in between run as they would in the user's own loop (on a GPU
    the CPU keeps queueing work), so their individual times are approximate while their sum is exact.
    A probe measures `measured_steps` steps and then goes on, up to `max_measured_steps`, until at
    least `min_measure_s` has been measured: five 3 ms steps are too short to time.
    A normal run (measured_steps None) never synchronises and only keeps totals and recent steps.
    The ranks of a distributed probe must stop at the same step (one left in a collective waits for
    ever): with `agree`, each rank works out after its first measured step how many steps reach
    `min_measure_s`, and all ranks measure the largest count any of them needs.
    """

    warmup_steps: int
    measured_steps: int | None  # None: no probe, train until the function returns
    synchronize: Callable[[], None]
    min_measure_s: float = 0.0
    max_measured_steps: int | None = None
    agree: Callable[[int], int] | None = None
    energy: Callable[[], float | None] | None = None
    """The device's energy counter in joules (NVML's total energy), read where measuring starts and
    ends; None where the device has none (a CPU)."""
    steps_done: int = 0
    measured_time_s: float = 0.0
    measured_samples: int = 0
    measured_tokens: int = 0
    step_times: deque = field(default_factory=lambda: deque(maxlen=_RECENT_STEPS))
    warmup_time_s: float | None = None
    """From the start to the end of warm-up (compilation and first-use costs land here)."""
    measured_energy_j: float | None = None
    """Energy the device drew over the measured steps (probes on a device with an energy counter)."""
    _energy_start: float | None = None
    data_wait_s: float | None = None
    """Host time the measured steps spent waiting for their data (inside `next()` on the user's
    iterable); None where autofit does not see the data (a framework's trainer drives the loop). On a
    GPU the wait can overlap kernels queued before it, so it bounds the device's idle time from above."""
    _waiting_s: float = 0.0  # data wait since the last step boundary: counts only if that step is measured
    _started: float | None = None
    _last: float | None = None
    _agreed_steps: int | None = None
    complete: bool = False

    @property
    def total_steps(self) -> int | None:
        """Warm-up plus the steps a probe measures at least (None for a normal run)."""
        if self.measured_steps is None:
            return None
        return self.warmup_steps + self.measured_steps

    @property
    def steps_measured(self) -> int:
        return max(0, self.steps_done - self.warmup_steps)

    def _stamp(self, exact: bool) -> float:
        if exact:
            self.synchronize()  # a CPU-GPU sync point: the queued kernels must be done
        return time.perf_counter()

    def start(self) -> None:
        exact = self.warmup_steps == 0 and self.measured_steps is not None
        self._last = self._started = self._stamp(exact=exact)
        self._waiting_s = 0.0  # the first fetch came before the clock started
        if exact:
            self._read_energy_start()

    def _read_energy_start(self) -> None:
        self._energy_start = self.energy() if self.energy is not None else None

    def _read_energy_end(self) -> None:
        if self._energy_start is not None and self.energy is not None:
            end = self.energy()
            self.measured_energy_j = end - self._energy_start if end is not None else None

    def data_waited(self, seconds: float) -> None:
        """A fetch of the data took `seconds` (it counts for the step it falls in, if that step is measured)."""
        self.data_wait_s = self.data_wait_s or 0.0
        self._waiting_s += seconds

    def step_done(self, samples: int, tokens: int) -> None:
        self.steps_done += 1
        waited, self._waiting_s = self._waiting_s, 0.0
        if self.data_wait_s is not None and self.steps_done > self.warmup_steps:
            self.data_wait_s += waited
        probing = self.measured_steps is not None
        if self.steps_done <= self.warmup_steps:
            self._last = self._stamp(exact=probing and self.steps_done == self.warmup_steps)
            if self.steps_done == self.warmup_steps and self._started is not None:
                self.warmup_time_s = self._last - self._started
            if probing and self.steps_done == self.warmup_steps:
                self._read_energy_start()
            return
        now = self._stamp(exact=False)
        if probing and self.agree is not None and self.steps_measured == 1:
            self._agreed_steps = self.agree(self._steps_needed(now - self._last))
        if probing and self._enough(self.measured_time_s + now - self._last):
            now = self._stamp(exact=True)
            self.complete = True
            self._read_energy_end()
        self.step_times.append(now - self._last)
        self.measured_time_s += now - self._last
        self.measured_samples += samples
        self.measured_tokens += tokens
        self._last = now

    def _steps_needed(self, first_step_s: float) -> int:
        """Measured steps that take `min_measure_s` at the first measured step's pace, within bounds."""
        needed = math.ceil(self.min_measure_s / max(first_step_s, 1e-9))
        needed = max(needed, self.measured_steps or 0)
        return min(needed, self.max_measured_steps) if self.max_measured_steps is not None else needed

    def _enough(self, measured_s: float) -> bool:
        if self._agreed_steps is not None:
            return self.steps_measured >= self._agreed_steps
        if self.steps_measured < (self.measured_steps or 0):
            return False
        if measured_s >= self.min_measure_s:
            return True
        return self.max_measured_steps is not None and self.steps_measured >= self.max_measured_steps

    @property
    def data_wait_share(self) -> float | None:
        """The measured time's share spent waiting for data (None: not seen, or nothing measured)."""
        if self.data_wait_s is None or self.measured_time_s <= 0:
            return None
        return min(1.0, self.data_wait_s / self.measured_time_s)

    def measured(self) -> tuple[list[float], int, int]:
        """Recent step times after warm-up, and the samples and tokens of all measured steps."""
        return list(self.step_times), self.measured_samples, self.measured_tokens


class Run:
    """One training run under one `Config`: a probe of a few steps, or the real thing.

    A real run with `recover_oom` survives a step that runs out of memory (its `redo`, a StepRedo):
    after the first optimizer step it redoes the step in place with a smaller micro-batch; before
    it, there is nothing to keep, and `restart_lowering` tells the launcher what to start again with.
    `redo` shares one StepRedo with earlier runs (the decorator's attempts); without it the run makes
    its own from `recover_oom`, `release_memory` and `used_memory`.
    """

    def __init__(
        self,
        config: Config,
        device: torch.device | str = "cpu",
        *,
        probing: bool = False,
        warmup_steps: int = 0,
        measured_steps: int | None = None,
        synchronize: Callable[[], None] | None = None,
        min_measure_s: float = 0.0,
        max_measured_steps: int | None = None,
        recover_oom: bool = False,
        release_memory: Callable[[], None] | None = None,
        used_memory: Callable[[], int] | None = None,
        defaults: bool = False,
        ranks: Ranks | None = None,
        redo: StepRedo | None = None,
        count_flops: bool = False,
        energy: Callable[[], float | None] | None = None,
    ) -> None:
        self.config = config
        self.ranks = ranks or Ranks()
        """Where this process stands in a distributed (torchrun) run; rank 0 of 1 otherwise."""
        self.defaults = defaults
        """True when no best-config file was found: `config` is the decorator's default, not a
        measured answer (a framework integration then leaves the user's own settings alone)."""
        self._device = torch.device(device)
        self._probing = probing
        self.knobs = Knobs()
        self._declared_workers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        """The workers the script declared to each loader run.loader() built (which one trains, run.batches says)."""
        #: False where the model must stay eager (the memory estimator's fake tensors).
        self.compile_enabled = True
        self.clock = StepClock(warmup_steps, measured_steps, synchronize or (lambda: None),
                               min_measure_s=min_measure_s, max_measured_steps=max_measured_steps,
                               agree=agree_on_most if probing and self.ranks.world_size > 1 else None,
                               energy=energy)
        sharded = self.ranks.world_size > 1 and config.sharding != "ddp"
        self.flops: StepFlops | None = StepFlops() if count_flops and not config.compile and not sharded else None
        """Model FLOPs of one optimizer step taken after the measured ones (probes of eager, unsharded
        configs: see _flops)."""
        self._counting_step = False  # the probe's measured steps are done; this step's FLOPs are counted
        self._scaler = make_grad_scaler(config.precision, self._device)
        self._micro_batches = 0  # handed out by batches()
        self._micro_in_step = 0  # of the optimizer step being fed
        self._backwards_in_step = 0  # run.backward() calls in the optimizer step being fed
        self._step_samples = 0
        self._step_tokens = 0
        # Whether every loss so far was finite, kept as one device flag updated in place (no sync,
        # no list): keeping each step's detached loss alive pinned glibc heap chunks between the
        # activations and made a probe's memory grow step by step (~3 MiB per step, measured).
        self._all_finite: torch.Tensor | None = None
        self.checked_losses = 0
        # OOM resilience (real runs only): see StepRedo.
        self.redo = redo if redo is not None else StepRedo(
            enabled=recover_oom and not probing, release_memory=release_memory, used_memory=used_memory)
        self._recovering = self.redo.enabled and not probing
        self._optimizer: torch.optim.Optimizer | None = None
        self._data_parallel: torch.nn.parallel.DistributedDataParallel | None = None
        self._sharded: Any = None  # an FSDP2 module (run.distribute with shard=)
        self._redoing = False  # the step being fed ran out of memory: batches() feeds it again
        self.restart_lowering: Lowering | None = None
        """Set when an OOM came before the first optimizer step: start the function again with its
        config (not yet taken: only the launcher knows whether it starts again)."""
        self._wrapped_blocks: weakref.WeakSet = weakref.WeakSet()
        """Blocks this run checkpointed: unwrapped when the run ends, so a model that outlives the run
        (built at import, met again by the next probe in one process or by a second call) is the
        user's own again."""
        self.notes: list[str] = []
        """What the run changed in how it measures (a probe's result carries them)."""
        self.data_context: Callable[[], Any] = contextlib.nullcontext
        """Entered around every read of the data in batches(): autofit's memory estimator reads real
        data there while the step itself runs on fake tensors."""

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
        """Samples per optimizer step, all ranks together."""
        return self.config.global_batch * self.ranks.world_size

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
    def rank(self) -> int:
        return self.ranks.rank

    @property
    def world_size(self) -> int:
        """Processes training together (torchrun's ranks); the global batch is micro-batch x
        accumulation x world size."""
        return self.ranks.world_size

    @property
    def is_main(self) -> bool:
        """True on the rank that logs, saves and reports (rank 0; always, in a single process)."""
        return self.ranks.is_main

    @property
    def lowerings(self) -> list[Lowering]:
        """The configs this run (and the attempts before it) lowered to after an OOM, oldest first."""
        return self.redo.lowerings

    @property
    def restart_config(self) -> Config | None:
        """The config to start the function again with after an OOM before the first optimizer step."""
        return self.restart_lowering.after if self.restart_lowering is not None else None

    @property
    def recovers_oom(self) -> bool:
        """True in a real run that survives an out-of-memory step by lowering its micro-batch."""
        return self._recovering

    @property
    def optimizer_steps(self) -> int:
        return self.clock.steps_done

    @property
    def micro_step(self) -> int:
        """Index of the micro-batch just handed out within its optimizer step (0 = a step begins).

        A step redone after an out-of-memory begins again at 0 with the same data: reset whatever
        you sum per step (losses, counts) when this is 0, and nothing is counted twice."""
        return max(0, self._micro_in_step - 1)

    # --- the helpers --------------------------------------------------------------------------
    def autocast(self):
        """Context for the forward pass under the chosen precision (fp32: nothing changes).

        In a real run it also catches an out-of-memory in the forward pass: the step is redone
        with a smaller micro-batch (the code between this block and `run.backward()` then runs once
        more with its previous values; `run.backward()` ignores that loss)."""
        self.knobs.autocast = True
        context = precision_context(self.config.precision, self._device)
        return _OomGuard(self, context, "forward") if self._recovering else context

    def backward(
        self, loss: torch.Tensor, optimizer: torch.optim.Optimizer, *, clip_grad_norm: float | None = None
    ) -> None:
        """Backward with accumulation and fp16 loss scaling; steps and zeroes at step boundaries.

        `clip_grad_norm`: clip the gradients' total norm before each optimizer step (after fp16
        unscaling, over all micro-batches of the step), as `torch.nn.utils.clip_grad_norm_` would.
        """
        self.knobs.backward = True
        if self._redoing:
            return  # the loss of a micro-batch whose step ran out of memory: the step is redone
        self._optimizer = optimizer
        where = "backward"
        try:
            scaled = loss / self.config.accumulation_steps
            if self._scaler is not None:
                scaled = self._scaler.scale(scaled)
            last = self._backwards_in_step + 1 >= self.config.accumulation_steps
            if self._sharded is not None:  # FSDP2: reduce-scatter the gradients once per step
                self._sharded.set_requires_gradient_sync(last)
            if self._data_parallel is not None and not last:
                with self._data_parallel.no_sync():  # gradients are averaged across ranks once per step
                    scaled.backward()
            else:
                scaled.backward()
            del scaled
            self._backwards_in_step += 1
            if self._backwards_in_step >= self.config.accumulation_steps:
                where = "optimizer step"
                self._optimizer_step(optimizer, clip_grad_norm)
                self._backwards_in_step = 0
                if self._probing:
                    self._check_finite(loss)
        except Exception as exc:
            if not self._caught(exc, where, loss):
                raise

    def _optimizer_step(self, optimizer: torch.optim.Optimizer, clip_grad_norm: float | None) -> None:
        if clip_grad_norm is not None:
            if self._scaler is not None:
                self._scaler.unscale_(optimizer)
            params = [p for group in optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)
        if self._scaler is not None:
            self._scaler.step(optimizer)
            self._scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # --- OOM resilience (real runs) -------------------------------------------------------------
    def _caught(self, exc: BaseException, where: str, loss: torch.Tensor | None = None) -> bool:
        """An exception in the step: True when it is an OOM this run recovers from in place (the
        step will be redone), False to let it propagate (set `restart_lowering` first when the
        launcher can start again because no optimizer step was taken yet)."""
        lowering = self._lowering_for(exc, where)
        if lowering is None:
            return False
        if lowering.restart:  # nothing trained yet: the launcher starts the function again
            self.restart_lowering = lowering
            return False
        if not self.knobs.batches:
            return False  # no data this run can feed again
        if loss is not None:
            drop_graph(loss)  # now: the user's `loss` would hold the failed graph to the redo
        self.config = self.redo.take(lowering)
        if self._scaler is not None:  # a step may have stopped after unscaling: start its state afresh
            self._scaler = torch.amp.GradScaler(self._device.type, init_scale=self._scaler.get_scale())
        self._redoing = True
        return True

    def lower_after_oom(self, exc: BaseException, where: str) -> bool:
        """An exception in a step that a framework's trainer drives (autofit.integrations): when it is
        an OOM and this run recovers, lower the config in place (micro-batch down, accumulation up,
        the global batch kept), record and announce it, and return True; the caller redoes the work
        (`redo.until_it_fits`). False: let it propagate. At micro-batch 1, OutOfMemoryAtBatchOne."""
        lowering = self._lowering_for(exc, where, in_place=True)
        if lowering is None:
            return False
        self.config = self.redo.take(lowering)
        return True

    def _lowering_for(self, exc: BaseException, where: str, *, in_place: bool = False) -> Lowering | None:
        if not self._recovering:
            return None
        restart = not in_place and self.clock.steps_done == 0
        return self.redo.lower(self.config, exc, where, self.clock.steps_done + 1, restart=restart)

    def release_memory(self) -> None:
        """Hand the memory of a failed step back to the device (call once its exception is gone)."""
        self.redo.free()

    def _begin_redo(self) -> None:
        """Forget the failed step: its gradients, its counters, and the memory it held."""
        self._redoing = False
        if self._optimizer is not None:
            self._optimizer.zero_grad(set_to_none=True)
        self._micro_in_step = self._backwards_in_step = 0
        self._step_samples = self._step_tokens = 0
        self.redo.free()

    def _check_finite(self, loss: torch.Tensor) -> None:
        finite = torch.isfinite(loss.detach()).all()
        if self._all_finite is None:
            self._all_finite = finite.clone()
        else:
            torch.logical_and(self._all_finite, finite, out=self._all_finite)
        self.checked_losses += 1

    def losses_finite(self) -> bool:
        """Whether every optimizer step's loss was finite (reads the device flag: one sync)."""
        return self._all_finite is None or bool(self._all_finite.item())

    def distribute(self, model: torch.nn.Module, *, blocks: Sequence[torch.nn.Module] | None = None,
                   shard: Sequence[torch.nn.Module] | None = None, offload: bool = False) -> torch.nn.Module:
        """`model` on this run's device; under torchrun, data-parallel across the ranks after checking
        that every rank trains with the same config (the process group joined if the function has
        not: gloo on CPU, NCCL on CUDA).

        With `blocks` (the model's repeated blocks), the config's `sharding` decides, and a search
        tries each: DistributedDataParallel ("ddp"); FSDP2 ("fsdp": `fully_shard` on each block,
        then the root; parameters, gradients and optimizer state split across ranks); the same kept
        on the CPU between uses ("fsdp-offload"). Without `blocks`, DDP. `shard` (blocks) forces
        FSDP2 whatever the config (`offload=True` adds the CPU offload). Apply checkpointing before;
        build the optimizer from the result's parameters."""
        if blocks is not None:
            blocks = list(blocks)
            self.knobs.shard_blocks = len(blocks)
        if self.ranks.world_size <= 1:
            return model.to(self._device)
        from autofit.runtime._distributed import check_same_config, data_parallel, ensure_process_group, fully_sharded

        ensure_process_group(self._device)
        check_same_config(self.config)
        if shard is None and blocks is not None and self.config.sharding != "ddp":
            shard, offload = blocks, self.config.sharding == "fsdp-offload"
        if shard is not None:
            self._sharded = fully_sharded(model, list(shard), self._device, offload=offload)
            return self._sharded
        self._data_parallel = data_parallel(model, self._device)
        return self._data_parallel

    def sampler(self, dataset: Any, *, shuffle: bool = True, seed: int = 0) -> torch.utils.data.Sampler:
        """The sampler for your DataLoader: this rank's shard of `dataset` under torchrun, the whole of
        it in one process; a DistributedSampler either way, so call `.set_epoch(epoch)` on it each
        epoch to reshuffle (the same script runs with and without torchrun)."""
        from autofit.runtime._distributed import data_sampler

        return data_sampler(dataset, self.ranks, shuffle=shuffle, seed=seed)

    def loader(self, dataset: Any, *, shuffle: bool = True, **kwargs: Any) -> torch.utils.data.DataLoader:
        """A DataLoader over `dataset` with this run's micro-batch and sampler (`run.sampler`; none for an
        IterableDataset), `drop_last=True` unless given. `num_workers`, `pin_memory` and `prefetch_factor`
        come from the config where it sets them, else from `kwargs` (what the script declares), else
        DataLoader's defaults: offering the loader here lets a search choose them."""

        declared = int(kwargs.get("num_workers", 0) or 0)
        if not self.knobs.loader:  # the first is the training loader (an evaluation one comes after it)
            self.knobs.declared_workers = declared
        self.knobs.loader = True
        iterable = isinstance(dataset, torch.utils.data.IterableDataset)  # it yields in its own order: no sampler
        sampler = None if iterable else self.sampler(dataset, shuffle=shuffle)
        loader = build_loader(dataset, self.config, self.batch_size, sampler, kwargs, probing=self._probing)
        self._declared_workers[loader] = declared
        return loader

    def compile(self, model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
        """`torch.compile(model, **kwargs)` when the config says so, else `model` as it is: offering
        the model here lets a search probe compiled and eager as separate strategies (the compile
        time is reported apart, never counted in a probe's throughput)."""
        self.knobs.compile = True
        if not self.config.compile or not self.compile_enabled:
            return model
        return torch.compile(model, **kwargs)

    def checkpoint(self, blocks: Sequence[torch.nn.Module]) -> Sequence[torch.nn.Module]:
        """Activation checkpointing on the first `checkpoint_segments` of `blocks`, and on none of
        the others (a model built once, at import, meets several configs in one process), under the
        config's `checkpoint_policy`: "full" recomputes each block's forward in backward, "selective"
        all of it but the matmul, convolution and attention outputs, which it keeps.

        Uses PyTorch's non-reentrant checkpoint; the modules keep their names and state-dict keys.
        """
        blocks = list(blocks) if not isinstance(blocks, torch.nn.ModuleList) else blocks
        self.knobs.checkpoint_blocks = len(blocks)
        for index, block in enumerate(blocks):
            if index < self.config.checkpoint_segments:
                apply_checkpoint(block, policy=self.config.checkpoint_policy)
                self._wrapped_blocks.add(block)
            else:
                remove_checkpoint(block)
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
        if not self.knobs.batches and isinstance(iterable, torch.utils.data.DataLoader) \
                and iterable in self._declared_workers:  # the loader the steps take their batches from
            self.knobs.declared_workers = self._declared_workers[iterable]
        if not self.knobs.batches:
            self._drain_prefetch(iterable)
        self.knobs.batches = True
        with self.data_context():
            source = iter(iterable)
        pending: deque = deque()  # micro-batches taken from the data and not yet handed out
        this_step: list = []  # micro-batches of the step being fed (kept only to redo it after an OOM)
        yielded = 0
        while True:
            if self._redoing:  # the step ran out of memory: feed it again, cut to the new micro-batch
                size = self.config.batch_size
                pending = deque(piece for item in (*this_step, *pending) for piece in split_batch(item, size))
                this_step = []
                self._begin_redo()
            if not pending:
                try:
                    with self.data_context():
                        fetch_started = time.perf_counter()
                        try:
                            batch = next(source)
                        finally:
                            self.clock.data_waited(time.perf_counter() - fetch_started)
                except StopIteration:
                    break
                # After a lowering the loader still gives the batch it was built with: cut it.
                pending.extend(split_batch(batch, self.config.batch_size) if self.lowerings else (batch,))
            batch = pending.popleft()
            yielded += 1
            if self._micro_batches == 0:
                self._start_clock()
            elif self._micro_in_step >= self.config.accumulation_steps and self._step_samples:
                self._finish_step()  # (not already closed at the end of the data)
                this_step = []
            self._micro_batches += 1
            self._micro_in_step += 1
            self._step_samples += count_samples(batch)
            self._step_tokens += _count_tokens(batch, tokens)
            if self._recovering:
                this_step.append(batch)
            yield to_device(batch, self._device)
        if self._micro_in_step >= self.config.accumulation_steps and self._step_samples:
            self._finish_step()  # the data ran out: the last step's work is done
        if self._probing and not yielded:
            # A loader with drop_last yields nothing for a batch larger than the dataset: a probe
            # looping over epochs would spin forever.
            raise DataTooSmall(
                f"The data yields no batch of {self.config.batch_size}: the batch is larger than the "
                f"data can feed (a DataLoader with drop_last=True over fewer samples, say).")

    def _drain_prefetch(self, iterable: Iterable[Any]) -> None:
        """Count the optimizer steps that empty the loader's prefetch queue as warm-up too.

        A DataLoader's workers fill their queue (workers x prefetch_factor batches) while the first,
        slow steps run; measured from there, a short window would time the queue rather than the
        loading, and a deeper prefetch would "win" by its size. The same rule holds for a probe and a
        normal run, so their figures are measured alike."""
        workers = getattr(iterable, "num_workers", 0) if isinstance(iterable, torch.utils.data.DataLoader) else 0
        if not workers:
            return
        queued = workers * (iterable.prefetch_factor or 2)
        steps = math.ceil(queued / self.config.accumulation_steps)
        self.clock.warmup_steps += steps
        self.notes.append(f"warm-up {steps} optimizer steps longer: the loader's prefetch queue "
                          f"({workers} workers x {iterable.prefetch_factor or 2} batches) drained before measuring")

    def _finish_step(self) -> None:
        samples, tokens = self._step_samples, self._step_tokens
        self._step_samples = self._step_tokens = 0
        self._micro_in_step = 0
        self.step_taken(samples, tokens)

    # --- loops autofit does not drive (a framework's trainer: autofit.integrations) --------------
    def adopt_loop(self, *, checkpoint_blocks: int | None = None) -> None:
        """A framework's trainer applies this run's settings itself: every knob counts, and the clock
        starts now (call it just before the trainer's first step)."""
        self.knobs.batches = self.knobs.backward = self.knobs.autocast = True
        if checkpoint_blocks is not None:
            self.knobs.checkpoint_blocks = checkpoint_blocks
        self._start_clock()

    def _start_clock(self) -> None:
        """The first step begins: the clock starts."""
        self.clock.start()

    def step_taken(self, samples: int, tokens: int = 0) -> None:
        """A framework's trainer took one optimizer step of `samples` samples; a probe that has its
        steps ends here (ProbeFinished).

        A probe that counts FLOPs takes one step more, after its measured ones, and counts that one:
        counting changes how the steps after it run (measured 7% slower on a CPU), so it comes last.
        Every rank takes that step, whether or not its counter starts, so ranks stay in step."""
        if self._counting_step:
            self.flops.end(samples)
            raise ProbeFinished()
        self.clock.step_done(samples, tokens)
        if self._probing and self.clock.complete:
            if self.flops is not None:
                self._counting_step = True
                self.flops.begin()
                return
            raise ProbeFinished()

    def finish(self) -> None:
        """Close the last step when the function left its loop early (a `break`)."""
        if self._micro_in_step >= self.config.accumulation_steps and self._step_samples:
            self._finish_step()

    @contextmanager
    def active(self) -> Iterator[Run]:
        """The run's lifetime: its precision holds for all of it (forward, backward, optimizer step)."""
        try:
            with precision_scope(self.config.precision, self._device):
                yield self
        finally:
            if self.flops is not None and self.flops.counting:
                self.flops.abandon()  # the counted step never closed (an error, or the data ended)
            self.unwrap_blocks()

    def unwrap_blocks(self) -> None:
        """Take this run's activation checkpointing off the blocks it put it on."""
        for block in list(self._wrapped_blocks):
            remove_checkpoint(block)
        self._wrapped_blocks.clear()

    def summary(self) -> dict[str, Any]:
        """What this run measured after its warm-up steps: the real run's figures, next to a probe's."""
        times, samples, tokens = self.clock.measured()
        seconds = self.clock.measured_time_s
        return {
            "config": self.config.to_dict(),
            "device": str(self._device),
            "optimizer_steps": self.clock.steps_done,
            "warmup_steps": min(self.clock.warmup_steps, self.clock.steps_done),
            "measured_steps": self.clock.steps_measured,
            "measured_s": seconds,
            "world_size": self.ranks.world_size,
            # Each rank counts its own samples; ranks step together, so all of them train world_size x.
            "samples_per_s": samples * self.ranks.world_size / seconds if seconds > 0 else None,
            "tokens_per_s": tokens * self.ranks.world_size / seconds if tokens and seconds > 0 else None,
            "step_time_median_s": statistics.median(times) if times else None,
            "data_wait_s": self.clock.data_wait_s,
            "data_wait_share": self.clock.data_wait_share,
            "recent_step_times_s": [round(t, 6) for t in times],
            "lowerings": [item.to_dict() for item in self.lowerings],
        }

    def report(self) -> None:
        """Say on stderr what a normal run measured; write it as JSON to $AUTOFIT_RUN_REPORT if set
        (the main rank only, in a distributed run)."""
        if not self.ranks.is_main:
            return
        summary = self.summary()
        ranks = f" on each of {self.ranks.world_size} ranks" if self.ranks.world_size > 1 else ""
        trained = f"autofit: trained {summary['optimizer_steps']} optimizer steps with {self.config.label()}{ranks}"
        if summary["samples_per_s"]:
            from autofit.probing import input_bound_text  # the verdict a probe gives, in its light record

            waited = input_bound_text(summary["data_wait_share"])
            print(f"{trained}: {summary['samples_per_s']:,.1f} samples/s after {summary['warmup_steps']} warm-up steps"
                  + (f" ({waited})" if waited else ""), file=sys.stderr)
        elif summary["optimizer_steps"]:  # the run ended within its warm-up: nothing was timed
            print(f"{trained}: too few to time after {self.clock.warmup_steps} warm-up steps", file=sys.stderr)
        path = os.environ.get("AUTOFIT_RUN_REPORT")
        if path:
            with open(path, "w") as handle:
                json.dump(summary, handle, indent=2)


class _OomGuard:
    """The forward pass's precision context, which also turns an OOM inside it into a redone step."""

    def __init__(self, run: Run, inner: Any, where: str) -> None:
        self._run, self._inner, self._where = run, inner, where

    def __enter__(self) -> Any:
        return self._inner.__enter__()

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        if self._inner.__exit__(kind, exc, tb):
            return True
        return exc is not None and isinstance(exc, Exception) and self._run._caught(exc, self._where)


def _count_tokens(batch: Any, tokens: int | Callable[[Any], int] | None) -> int:
    if tokens is None:
        return 0
    if callable(tokens):
        return int(tokens(batch))
    return int(tokens) * count_samples(batch)
