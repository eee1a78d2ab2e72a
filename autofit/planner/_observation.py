"""What the planner knows of one probed (or claimed) config: a plain record, free of Optuna."""

from __future__ import annotations

from dataclasses import dataclass

from autofit.config import KNOBS, Config

#: The knobs that change a step's speed and not what fits (`order` "compute", autofit.knobs): each is tried on
#: the leader (rule 11, _variant_rule.py), not a strategy of its own.
COMPUTE_KNOBS = tuple(k for k in KNOBS if k.order == "compute")

#: The user's code failed: a precision (sharding, compile, policy) that only fails is unusable. A timeout is
#: not among them: it says the config is slow to start or to step, a speed fact, not that it cannot run.
FAILED_STATUSES = ("error", "diverged", "crashed")


def compute_variant(config: Config) -> tuple[tuple[str, object], ...]:
    """The knobs of COMPUTE_KNOBS `config` sets other than their default, as (name, value) pairs."""
    return tuple((k.name, value) for k in COMPUTE_KNOBS if (value := getattr(config, k.name)) != k.default)


def is_variant(config: Config) -> bool:
    """A variant of the leader probed last (other loader settings, a squares cap, a compute knob): not a point
    of its strategy's curves, and not a leader the other rules start from."""
    return bool(config.loader) or config.max_squares is not None or bool(compute_variant(config))


@dataclass(frozen=True)
class Observation:
    config: Config
    status: str  # a ProbeResult status, or "running" for a config a parallel worker is probing
    peak_bytes: int | None = None
    rate: float | None = None
    """The throughput the search ranks by (`Config.ranked_by`): samples/s, or real tokens/s by tokens.
    The planner compares, models and bounds this figure alone, whichever it is."""
    wall_s: float = 0.0
    phase: str = "explore"  # explore, recheck, remeasure or confirm
    spread: float | None = None  # step-time IQR / median step time: how steady the probe's steps were
    tight: bool = False  # the allocator had to free its cache and retry to stay under the cap
    data_bound: bool = False  # the data ran out before the probe had its steps: the batch is too big for it
    data_wait_share: float | None = None  # share of the measured time spent waiting for data (run.batches)
    trial: int | None = None  # the study's trial that holds the probe (None in replays): its other figures
    start_s: float | None = None  # before its first micro-batch ended: set-up, its own evaluation, compilation
    step_s: float | None = None  # one of the probe's own optimizer steps (of `ran_accumulation` micro-batches)
    ran_accumulation: int | None = None  # micro-batches a step the probe ran (None: the config's own)
    cut: bool = False  # the search's budget ended it: nothing measured, no verdict on the config
    stalled: bool = False  # timed out in its steps (no progress for the stall limit), not in its start

    def fits(self, usable_bytes: float) -> bool:
        """Ran its steps with its peak inside the usable memory."""
        return self.status == "ok" and (self.peak_bytes is None or self.peak_bytes <= usable_bytes)

    def too_big(self, usable_bytes: float) -> bool:
        """Out of memory, or ran but crossed into the headroom: larger configs cannot fit either."""
        return self.status == "oom" or (
            self.status == "ok" and self.peak_bytes is not None and self.peak_bytes > usable_bytes
        )

    @property
    def failed(self) -> bool:
        """The user's code failed here (not: the data could not feed this batch)."""
        return self.status in FAILED_STATUSES and not self.data_bound

    @property
    def timed_out(self) -> bool:
        """Killed for taking too long to start or to step (not cut by the budget's end)."""
        return self.status == "timeout" and not self.cut
