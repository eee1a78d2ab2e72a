"""`RunSettings`: everything a `Run` is built with, in one frozen record, with the hooks its builder declares
(`RunHooks`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autofit.config import Config

if TYPE_CHECKING:
    import torch

    from autofit.runtime._distributed import Ranks
    from autofit.runtime._envelope import TokenEnvelope
    from autofit.runtime._redo import StepRedo


def _nothing(*_: Any) -> None:
    pass


@dataclass(frozen=True)
class RunHooks:
    """What a run calls at its seams for whoever built it, declared when it is built: the memory
    estimator reads the data for real while the step runs on fake tensors, follows each optimizer's
    parameters, restarts its tracker at each step and follows the blocks offered to checkpointing. Each default
    does nothing."""

    data_context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
    """Entered around every read of the data in `run.batches()`."""
    before_backward: Callable[[torch.optim.Optimizer], None] = _nothing
    """Called with the optimizer at each `run.backward()`, before its work."""
    after_step: Callable[[], None] = _nothing
    """Called after each optimizer step the run counted (`RunControl.step_taken`), unless it ended the
    probe (ProbeFinished)."""
    blocks_offered: Callable[[Sequence[torch.nn.Module]], None] = _nothing
    """Called with the blocks offered to `run.checkpoint()`, once it has applied the config to them (the
    memory estimator follows each block's forward and backward)."""


@dataclass(frozen=True)
class RunSettings:
    """One config and how a run under it measures and recovers: a probe's (its steps, its clock) or a
    real run's (its OOM redo). Built by the probe, the decorator and the memory estimator."""

    config: Config
    device: torch.device | str = "cpu"
    probing: bool = False
    """A probe: a few measured steps, then ProbeFinished; an OOM is its answer, never redone."""
    warmup_steps: int = 0
    """Optimizer steps left out of the figures (compilation and first-use costs land there)."""
    measured_steps: int | None = None
    """Steps a probe measures at least; None: a real run, trained until the function returns."""
    synchronize: Callable[[], None] | None = None
    """Waits for the device's queued work: called only where a time must be exact."""
    min_measure_s: float = 0.0
    """A probe measures past `measured_steps` until this much is measured (a clock must resolve it)."""
    max_measured_steps: int | None = None
    """...but never past this many steps."""
    recover_oom: bool = False
    """A real run survives an out-of-memory step by lowering its micro-batch (a new StepRedo)."""
    holds_saved: bool = False
    """A probe of a function whose normal run recovers from OOMs: its forwards under run.autocast() save for
    backward through the same hooks as that run's (autofit.runtime._saved), so their cost (a Python call for each
    saved tensor, a tenth of a host-bound step) is in its figures as in the run's. It never redoes a step."""
    release_memory: Callable[[], None] | None = None
    """Hands a failed step's memory back to the device (the new StepRedo's)."""
    used_memory: Callable[[], int] | None = None
    """What the process holds, recorded with each lowering (the new StepRedo's)."""
    defaults: bool = False
    """No best-config file was found: `config` is the decorator's default, not a measured answer."""
    ranks: Ranks | None = None
    """Where this process stands in a torchrun run; None: rank 0 of 1."""
    redo: StepRedo | None = None
    """An OOM redo shared with earlier runs (the decorator's attempts); None: a new one from
    `recover_oom`, `release_memory` and `used_memory`."""
    count_flops: bool = False
    """A probe counts one optimizer step's model FLOPs after its measured ones (eager, unsharded)."""
    global_tokens: int | None = None
    """Tokens per optimizer step, all ranks together (`@autofit(global_tokens=N)`): token batches
    (run.token_batches) accumulate as many micro-batches as hold about that many."""
    energy: Callable[[], float | None] | None = None
    """The device's energy counter in joules, read where measuring starts and ends; None on a CPU."""
    alloc_retries: Callable[[], int | None] | None = None
    """The allocator's count of the times it freed its cache to retry an allocation (CUDA's num_alloc_retries),
    read where measuring starts and ends: retries in the measured steps mean the config runs at the edge of
    memory, and slower for it; None where the device keeps no such count."""
    timing: Callable[[bool], None] | None = None
    """Told True where a probe's measured steps begin and False where they end (DeviceBackend.timing): what the
    device runs beside them to read the peak pauses, so they run as the normal run's do."""
    host_memory: Callable[[], int | None] | None = None
    """The host memory available now (bytes), read when an activation offload starts: the bound of its pinned
    memory is `HOST_SHARE` of it (autofit.runtime._offload); None: no bound (the memory estimator's)."""
    token_envelope: TokenEnvelope | None = None
    """The micro-batches by tokens the search's probes ran (the best-config file's): a normal run splits
    one beyond them before it runs (TokenGuard); None: no check."""
    probe_accumulation: int | None = None
    """A probe's most micro-batches per optimizer step (PROBE_ACCUMULATION): a config that accumulates
    more runs this many, and its own step is priced from them (autofit.runtime._accumulation); None: the
    config's accumulation runs as it is."""
    progress: Callable[[int, int], None] | None = None
    """Told (micro-batches done, optimizer steps done) as a probe runs: its sign of life to the runner."""
    open_step_s: float | None = None
    """How long a probe follows a loop with a finite loss past the micro-batches it allows without an optimizer
    step (a loop's own long accumulation: autofit.runtime._open_step), what its limits allow a step; None: it
    ends there."""
    worst_token_batches: bool = False
    """The memory estimator's: every micro-batch by tokens (run.token_batches) is the cap's worst, the
    data's longest samples as many as the cap holds, so an estimate answers for the cap, not for a draw."""
    hooks: RunHooks = field(default_factory=RunHooks)
    """Called at the run's seams (`RunHooks`): the memory estimator's; none by default."""
