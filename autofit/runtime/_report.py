"""What a run measured after its warm-up, as one plain record: a real run's figures, next to a probe's."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from autofit.config import Config
from autofit.runtime._clock import StepClock
from autofit.runtime._distributed import Ranks
from autofit.runtime._redo import Lowering
from autofit.runtime._tokens import TokenLoader


def run_summary(config: Config, device: torch.device, clock: StepClock, ranks: Ranks,
                lowerings: list[Lowering], token_loader: TokenLoader | None = None, *,
                guard_split_batches: int = 0, oom_split_batches: int = 0) -> dict[str, Any]:
    """The run's config, its steps and what the measured ones did (all ranks together), the configs it
    lowered to after an OOM, for batches by tokens their padding share (`tokens_per_s` counts the real
    ones), and the micro-batches run in pieces: beyond the probes' envelope (the token guard), and cut
    to a micro-batch an OOM lowered the run to (this rank's)."""
    times, samples, tokens = clock.measured()
    seconds = clock.measured_time_s
    return {
        "config": config.to_dict(),
        "device": str(device),
        "optimizer_steps": clock.steps_done,
        "warmup_steps": min(clock.warmup_steps, clock.steps_done),
        "measured_steps": clock.steps_measured,
        "measured_s": seconds,
        "world_size": ranks.world_size,
        # Each rank counts its own samples; ranks step together, so all of them train world_size x.
        "samples_per_s": samples * ranks.world_size / seconds if seconds > 0 else None,
        "tokens_per_s": tokens * ranks.world_size / seconds if tokens and seconds > 0 else None,
        "step_time_median_s": statistics.median(times) if times else None,
        "data_wait_s": clock.data_wait_s,
        "data_wait_share": clock.data_wait_share,
        "recent_step_times_s": [round(t, 6) for t in times],
        "lowerings": [item.to_dict() for item in lowerings],
        # the allocator's retries after warm-up (CUDA): the run at the edge of memory, slower for it (None: not counted)
        "alloc_retries": clock.counts_so_far().get("alloc_retries"),
        "guard_split_batches": guard_split_batches,
        "oom_split_batches": oom_split_batches,
        **({"padding_share": token_loader.stats().padding_share} if token_loader is not None else {}),
    }
