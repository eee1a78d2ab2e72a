"""A recorded landscape: every config of a search space, measured once for real.

`Landscape.probe(config)` replays a recorded probe as an `Observation`. Throughput can be replayed
with seeded multiplicative noise (log-normal, its spread taken from the recorded step-time IQR), so
that two probes of one config differ as real probes do; status and peak memory replay as recorded.
Each replayed probe is charged its recorded wall time. Landscapes recorded with repeats keep every
run; the entry holds the fastest; their spread can serve as the replay noise instead of the IQR.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import statistics
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from autofit.config import Config
from autofit.memory import peak_factors
from autofit.planner import MemoryPrediction, Observation, SearchSpace, configs_to_estimate

LANDSCAPE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "landscapes")

#: IQR of a normal distribution in standard deviations: sigma = IQR / 1.349.
_IQR_PER_SIGMA = 1.349
#: Relative noise is capped here (a probe swamped by a neighbour's load would say nothing anyway).
_MAX_SIGMA = 0.25


@dataclass
class Entry:
    """What the recorder measured (or implied) for one config."""

    config: Config
    status: str
    peak_bytes: int | None = None
    samples_per_s: float | None = None
    step_time_median_s: float | None = None
    step_time_iqr_s: float | None = None
    wall_s: float = 0.0
    implied: bool = False  # not probed: a smaller batch of the same strategy ran out of memory
    error: str | None = None
    runs: list[dict] | None = None  # every probe of the config when it was recorded more than once
    estimate: dict[str, int] | None = None  # the memory estimator's tensor bytes by part (record_estimates)
    estimate_error: str | None = None  # why the estimator gave none

    def to_dict(self) -> dict:
        data = asdict(self)
        data["config"] = self.config.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Entry:
        known = set(cls.__dataclass_fields__)
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["config"] = Config.from_dict(data["config"])
        return cls(**kwargs)

    @property
    def relative_sigma(self) -> float:
        """Relative spread of one probe's throughput, from the recorded step-time IQR."""
        if not self.step_time_median_s or self.step_time_iqr_s is None:
            return 0.0
        return min(_MAX_SIGMA, self.step_time_iqr_s / self.step_time_median_s / _IQR_PER_SIGMA)

    def run_rates(self) -> list[float]:
        return [r["samples_per_s"] for r in self.runs or () if r["status"] == "ok" and r["samples_per_s"]]


@dataclass
class Landscape:
    """A search space with one recorded entry per config, under one memory limit and headroom."""

    name: str
    space: SearchSpace
    memory_limit_bytes: int
    headroom: float
    entries: dict[Config, Entry]
    device: dict = field(default_factory=dict)
    baseline_bytes: int | None = None
    meta: dict = field(default_factory=dict)

    # --- storage ------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict) -> Landscape:
        entries = [Entry.from_dict(e) for e in data["configs"]]
        return cls(
            name=data["name"],
            space=SearchSpace.from_dict(data["space"]),
            memory_limit_bytes=int(data["memory_limit_bytes"]),
            headroom=float(data["headroom"]),
            entries={e.config: e for e in entries},
            device=data.get("device", {}),
            baseline_bytes=data.get("baseline_bytes"),
            meta=data.get("meta", {}),
        )

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "space": self.space.to_dict(),
            "memory_limit_bytes": self.memory_limit_bytes,
            "headroom": self.headroom,
            "usable_bytes": self.usable_bytes,
            "device": self.device,
            "baseline_bytes": self.baseline_bytes,
            "meta": self.meta,
            "configs": [self.entries[c].to_dict() for c in self.space.configs() if c in self.entries],
        }

    @classmethod
    def load(cls, path: str) -> Landscape:
        with open(path) as handle:
            return cls.from_dict(json.load(handle))

    def save(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(self.to_dict(), handle, indent=1)
            handle.write("\n")
        os.replace(tmp, path)

    # --- truth ----------------------------------------------------------------------------------
    @property
    def usable_bytes(self) -> float:
        return self.memory_limit_bytes * (1.0 - self.headroom)

    def configs(self) -> list[Config]:
        return self.space.configs()

    def feasible(self, config: Config) -> bool:
        """Ran its steps with its recorded peak inside the usable memory."""
        e = self.entries[config]
        return e.status == "ok" and e.peak_bytes is not None and e.peak_bytes <= self.usable_bytes

    def true_throughput(self, config: Config | None) -> float:
        """Recorded (noise-free) samples/s of a feasible config; 0 for None or an infeasible one."""
        if config is None or config not in self.entries or not self.feasible(config):
            return 0.0
        return float(self.entries[config].samples_per_s or 0.0)

    @functools.cached_property
    def between_run_sigma(self) -> float | None:
        """Spread of log(samples/s) between two probes of one config, estimated robustly: the
        median over configs of |log r1 - log r2|, / (0.6745 * sqrt 2). Long slowdowns by other jobs
        (which hit a few pairs hard) do not inflate it. None when no config was probed twice."""
        gaps = []
        for e in self.entries.values():
            rates = e.run_rates()
            if len(rates) >= 2:
                gaps.append(abs(math.log(rates[0]) - math.log(rates[1])))
        return statistics.median(gaps) / (0.6745 * math.sqrt(2)) if gaps else None

    def sigma(self, config: Config, model: str = "iqr") -> float:
        """Relative throughput noise of one replayed probe, at most 0.25.

        "iqr": the config's own step-time IQR / median / 1.349 (the spread within its probe).
        "runs": the typical spread between two probes of one config (`between_run_sigma`), which on
        a shared machine also carries changes of the other jobs' load; falls back to "iqr"."""
        if model == "runs" and self.between_run_sigma is not None:
            return min(_MAX_SIGMA, self.between_run_sigma)
        if model not in ("iqr", "runs", "interference"):
            raise ValueError(f"unknown noise model {model!r}")
        return self.entries[config].relative_sigma

    def best_config(self) -> Config | None:
        feasible = [c for c in self.configs() if self.feasible(c)]
        return max(feasible, key=self.true_throughput) if feasible else None

    def best_throughput(self) -> float:
        return self.true_throughput(self.best_config())

    def prediction(self) -> MemoryPrediction | None:
        """What a live search's estimator would have told the planner: the recorded estimates of the
        configs a search asks for (the rest interpolated); None before record_estimates ran."""
        estimator = self.meta.get("estimator")
        if not estimator:
            return None
        estimated = {c: sum(self.entries[c].estimate.values()) for c in configs_to_estimate(self.configs())
                     if self.entries[c].estimate}
        return MemoryPrediction.from_estimates(estimated, device_bytes=estimator["baseline_bytes"] or 0,
                                               **peak_factors("cpu"))

    def grid_seconds(self) -> float:
        """Probe-seconds of measuring every config once (implied OOMs at their OOM probe's wall)."""
        return sum(self.entries[c].wall_s for c in self.configs())

    # --- replay ---------------------------------------------------------------------------------
    def probe(self, config: Config, *, noise: float = 0.0, seed: int = 0, repeat: int = 0,
              noise_model: str = "iqr", length: float = 1.0) -> Observation:
        """The recorded probe of `config` as an Observation.

        With `noise` > 0, samples/s is multiplied by exp(N(0, noise * sigma)) with sigma from
        `sigma(config, noise_model)`; the draw is a pure function of (seed, config, repeat), so
        every strategy sees the same value for the same probe (common random numbers).
        `length` > 1 replays a probe with that many times the recorded measured steps: its noise
        shrinks by sqrt(length), its wall time grows by the added steps (an OOM costs the same).
        """
        if config not in self.entries:
            raise KeyError(f"{config.label()} is not in the landscape {self.name!r}")
        e = self.entries[config]
        rate = e.samples_per_s
        sigma = self.sigma(config, noise_model) / math.sqrt(length) if rate is not None and noise > 0 else 0.0
        if sigma > 0:
            rng = random.Random(f"{seed}|{config.label()}|{repeat}")
            rate = rate * math.exp(rng.gauss(0.0, noise * sigma))
        spread = e.step_time_iqr_s / e.step_time_median_s if e.step_time_median_s and e.step_time_iqr_s else None
        if noise_model == "interference" and rate is not None:
            rate, spread = _interfere(rate, spread, random.Random(f"interference|{seed}|{config.label()}|{repeat}"))
        wall = e.wall_s
        if length != 1.0 and e.status == "ok":
            warmup, steps = self.meta.get("warmup", 2), self.meta.get("steps", 5)
            wall = e.wall_s * (warmup + length * steps) / (warmup + steps)
        return Observation(config=config, status=e.status, peak_bytes=e.peak_bytes,
                           rate=rate, wall_s=wall, spread=spread)


#: Injected interference ("interference" noise model): the chance that another job shares the
#: machine during a probe, how much it slows the probe (seen here: up to 4x), and the chance that
#: it also makes the probe's steps erratic (a competing process on the CPU) rather than uniformly
#: slower (a steady co-tenant).
INTERFERENCE_CHANCE = 0.25
INTERFERENCE_SLOWDOWN = (1.5, 4.0)
INTERFERENCE_ERRATIC = 0.5
_ERRATIC_SPREAD = (4.0, 10.0)


def _interfere(rate: float, spread: float | None, rng: random.Random) -> tuple[float, float | None]:
    """One probe's throughput and step spread when another job may have shared the machine."""
    if rng.random() >= INTERFERENCE_CHANCE:
        return rate, spread
    rate /= rng.uniform(*INTERFERENCE_SLOWDOWN)
    if rng.random() < INTERFERENCE_ERRATIC:
        spread = max(spread or 0.02, 0.02) * rng.uniform(*_ERRATIC_SPREAD)
    return rate, spread


def landscape_paths(directory: str = LANDSCAPE_DIR) -> list[str]:
    if not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".json"))


def synthetic(
    name: str,
    space: SearchSpace,
    memory_limit_bytes: int,
    headroom: float,
    peak: Callable[[Config], float],
    rate: Callable[[Config], float],
    wall: Callable[[Config], float] = lambda c: 10.0,
    sigma: float = 0.0,
    baseline_bytes: int | None = None,
) -> Landscape:
    """A landscape from formulas: `peak(config)` bytes (OOM where it exceeds the limit),
    `rate(config)` samples/s, `wall(config)` seconds; `sigma` the relative step-time IQR."""
    entries: dict[Config, Entry] = {}
    for c in space.configs():
        p = peak(c)
        if p > memory_limit_bytes:
            entries[c] = Entry(c, "oom", wall_s=wall(c))
        else:
            step = c.global_batch / rate(c)
            entries[c] = Entry(c, "ok", peak_bytes=int(p), samples_per_s=rate(c), step_time_median_s=step,
                               step_time_iqr_s=sigma * step, wall_s=wall(c))
    return Landscape(name, space, memory_limit_bytes, headroom, entries, baseline_bytes=baseline_bytes,
                     meta={"study": "synthetic"})


def describe(landscape: Landscape, configs: Iterable[Config] | None = None) -> str:
    """A plain text table of the landscape (for eyeballing a recording)."""
    lines = []
    for c in configs or landscape.configs():
        e = landscape.entries[c]
        rate = f"{e.samples_per_s:8.1f}" if e.samples_per_s else "       -"
        peak = f"{e.peak_bytes / 2**20:8.0f} MiB" if e.peak_bytes else "           -"
        mark = " *" if landscape.feasible(c) else ""
        lines.append(f"{c.label():<32} {e.status:<5}{' (implied)' if e.implied else '':<10} "
                     f"{rate} samples/s {peak} {e.wall_s:6.1f}s{mark}")
    return "\n".join(lines)
