"""What a train function sees: the `Run` (built from one `RunSettings`; a face over its step clock,
its step feed, the knobs it offers and its summary), precision as data, activation checkpointing and
offload, distributed set-up, OOM classification, the one OOM-redo path (`StepRedo`, which a Run's loop reaches
through `LoopRedo` and a framework's step through `PieceReplay`), the one walk over a nested batch
(`map_batch`) and a normal run's memory cap.

Everything here runs inside the user's process (a probe's worker, a rank, a normal run)."""

from __future__ import annotations

from autofit.runtime._accumulation import PricedSteps, price_steps
from autofit.runtime._batch import batch_len, batch_tensors, count_samples, map_batch, split_batch, to_device
from autofit.runtime._checkpoint import checkpoint_policy_of, saved_ops
from autofit.runtime._clock import SPREAD_EXTENSION, ProbeFinished, StepClock
from autofit.runtime._compile_timer import CompileTimer
from autofit.runtime._control import RunControl
from autofit.runtime._distributed import Ranks, leave_process_group, per_rank_config, ranks_from_env
from autofit.runtime._envelope import TokenEnvelope, TokenGuard
from autofit.runtime._feed import DataTooSmall
from autofit.runtime._knobs import Knobs, block_plan
from autofit.runtime._memory_cap import MEMORY_LIMIT_ENV, describe_memory_limit, memory_limit_from_env
from autofit.runtime._offload import (
    HOST_SHARE,
    MIN_OFFLOAD_BYTES,
    ActivationOffload,
    HostMemoryExhausted,
    OffloadTransport,
    made_by_forward,
    offload_transport,
)
from autofit.runtime._oom import breaks_the_device, is_oom
from autofit.runtime._open_step import NoStepClosed
from autofit.runtime._pieces import PieceReplay, loss_of, weighted
from autofit.runtime._precision import precision_context, precision_scope
from autofit.runtime._redo import (
    RECOVERY_ENV,
    LoopRedo,
    LoweredRun,
    Lowering,
    OutOfMemoryAtBatchOne,
    StepRedo,
    announce,
    drop_graph,
    lowered,
    lowered_path,
    normal_run_recovers,
    read_lowerings,
    record_lowerings,
    recovery_enabled,
)
from autofit.runtime._report import run_summary
from autofit.runtime._run import Run
from autofit.runtime._script_run import ONE_START, StartReached, offer_script_run, take_script_run
from autofit.runtime._settings import RunHooks, RunSettings
from autofit.runtime._shape_caches import DEFAULT_CAPACITIES
from autofit.runtime._tokens import TokenBatchSampler, TokenBatchStats

__all__ = [
    "ActivationOffload",
    "HOST_SHARE",
    "HostMemoryExhausted",
    "MIN_OFFLOAD_BYTES",
    "OffloadTransport",
    "offload_transport",
    "CompileTimer",
    "PricedSteps",
    "price_steps",
    "MEMORY_LIMIT_ENV",
    "ONE_START",
    "RECOVERY_ENV",
    "DEFAULT_CAPACITIES",
    "DataTooSmall",
    "Knobs",
    "LoopRedo",
    "LoweredRun",
    "Lowering",
    "NoStepClosed",
    "OutOfMemoryAtBatchOne",
    "PieceReplay",
    "ProbeFinished",
    "Ranks",
    "Run",
    "RunControl",
    "RunHooks",
    "RunSettings",
    "SPREAD_EXTENSION",
    "StepClock",
    "StartReached",
    "StepRedo",
    "TokenBatchSampler",
    "TokenBatchStats",
    "TokenEnvelope",
    "TokenGuard",
    "announce",
    "batch_len",
    "batch_tensors",
    "block_plan",
    "breaks_the_device",
    "checkpoint_policy_of",
    "count_samples",
    "describe_memory_limit",
    "drop_graph",
    "is_oom",
    "made_by_forward",
    "leave_process_group",
    "memory_limit_from_env",
    "normal_run_recovers",
    "offer_script_run",
    "lowered",
    "loss_of",
    "lowered_path",
    "map_batch",
    "per_rank_config",
    "precision_context",
    "precision_scope",
    "ranks_from_env",
    "read_lowerings",
    "record_lowerings",
    "recovery_enabled",
    "run_summary",
    "saved_ops",
    "split_batch",
    "take_script_run",
    "to_device",
    "weighted",
]
