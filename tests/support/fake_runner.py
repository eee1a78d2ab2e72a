"""A runner of the probing contract that runs nothing: each probe's figures come from a function of the
config and the probe's measured steps, so a test decides what a whole search measures (short probes,
longer remeasurements, the A/B's rounds) and the search decides everything else. Its wall times are
figures too: the search's clock estimates from them, however fast the machine is."""

from __future__ import annotations

import os
from collections.abc import Callable

from autofit.config import Config
from autofit.export import MemoryBudget
from autofit.probing import ProbeResult, WorkerInfo

#: What `rate(config, steps)` answers for a probe: its samples/s.
Rate = Callable[[Config, int], float]


class FakeRunner:
    """Answers every probe at once with `rate(config, steps)` samples/s, a peak of `batch_size` MiB, a
    wall of `wall_s` seconds and steps that spread by `spread` (IQR over the median: the machine's noise);
    `calls` keeps (config, steps) of each probe, in order."""

    next_start_s = 0.0  # never replaced

    def __init__(self, script: str, function: str | None, rate: Rate, *, wall_s: float = 1.0,
                 knobs: dict | None = None, device: str = "cpu", index: int = 0, budget: MemoryBudget | None = None,
                 spread: float = 0.01, **_: object) -> None:
        self.script, self.function, self.device, self.index = script, function, device, index
        self.budget = budget or MemoryBudget(limit_bytes=None)
        self.rate, self.wall_s, self.spread = rate, wall_s, spread
        self.knobs = knobs if knobs is not None else {"batches": True}
        self.info: WorkerInfo | None = None
        self.calls: list[tuple[Config, int]] = []

    def start(self) -> WorkerInfo:
        self.info = WorkerInfo(function=self.function or "train", options=None, device={"type": "cpu"},
                               precisions=["fp32", "bf16"], default_precisions=["fp32"], baseline_bytes=0,
                               memory_limit=self.budget.limit_bytes, versions={}, load_s=0.0, pid=os.getpid())
        return self.info

    def probe(self, config: Config, *, warmup: int = 2, steps: int = 5, timeout: float = 300.0,
              log_path: str | None = None, **_: object) -> ProbeResult:
        self.calls.append((config, steps))
        rate = self.rate(config, steps)
        step_s = config.global_batch / rate
        return ProbeResult(status="ok", config=config, samples_per_s=rate, step_time_median_s=step_s,
                           step_time_iqr_s=self.spread * step_s, warmup_steps=warmup, measured_steps=steps,
                           peak_bytes=config.batch_size * 2**20, memory_limit=self.budget.limit_bytes,
                           wall_s=self.wall_s, knobs=dict(self.knobs), log_path=log_path)

    def kill(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> FakeRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
