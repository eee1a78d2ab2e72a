"""The input pipeline's turn (rule 8 of the planner): when the function offers `run.loader()` and the
leader's probes waited for their data, probe the leader with other loader settings.

Waiting a share s of the step for data, a faster loader makes the step at most 1/(1-s) faster: under
MIN_LOADER_SHARE that is within a probe's noise, and the loader is left as the script declares it.
Otherwise three steps, each on the fastest config so far, each stopping at the first variant that is
no faster: more workers (from the count that could keep pace, s/(1-s) workers loading in parallel
with the step, up the ladder), then prefetching further ahead (workers only), then pinned host memory
(a GPU only). Pure logic over observations, like the rest of the planner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from autofit.config import LOADER_FIELDS, LOADER_WORKERS, Config
from autofit.planner._observation import Observation, is_variant
from autofit.planner._ranking import Candidate

#: Below this share of the measured time waiting for data, a faster loader gains under 1/(1-0.03), about
#: 3%: within the noise of a probe, so no probe is spent on it.
MIN_LOADER_SHARE = 0.03
#: A loader variant must be this much faster than the best so far for the search to go on up its ladder.
_LOADER_GAIN = 1.03


@dataclass(frozen=True)
class LoaderChoices:
    """The loader settings a search may try (empty workers: the function does not offer run.loader)."""

    workers: tuple[int, ...] = ()
    """Worker counts, capped by the cores a probe may load with (`loader_worker_counts`)."""
    pin_memory: tuple[bool, ...] = ()
    """(True,) on a GPU: pinned batches copy faster; () on the CPU, where pinning gains nothing."""
    prefetch_factors: tuple[int, ...] = ()
    """Prefetch depths other than DataLoader's default of 2, tried only with workers."""
    declared_workers: int = 0
    """The workers the script declares (run.loader's num_workers; DataLoader's default 0)."""

    @property
    def offered(self) -> bool:
        return bool(self.workers)


def loader_worker_counts(cores: int, *, ranks_per_node: int = 1, probes_at_once: int = 1) -> tuple[int, ...]:
    """The LOADER_WORKERS a search tries: within the cores one training process of the real run has (a
    node's cores over its ranks, each rank with its own loader), and within a probe's share of them while
    `probes_at_once` probes run side by side, where more workers would measure the other probes'
    contention rather than the loader."""
    share = cores // max(1, ranks_per_node) // max(1, probes_at_once)
    return tuple(w for w in LOADER_WORKERS if w <= share)


def shared_cores_loader_note(cores: int, *, ranks_per_node: int = 1, probes_at_once: int = 1) -> str | None:
    """One line when probes running side by side kept the loader below the workers the real run could
    use (None when they did not)."""
    run = loader_worker_counts(cores, ranks_per_node=ranks_per_node)
    probed = loader_worker_counts(cores, ranks_per_node=ranks_per_node, probes_at_once=probes_at_once)
    if probed == run:
        return None
    return (f"loader workers were tried up to {probed[-1]}, not the {run[-1]} your run could use: {probes_at_once} "
            f"probes at once shared {cores} cores; search one probe at a time (--parallel 1) to tune the loader fully")


def leader(ranked: Sequence[Candidate]) -> Candidate | None:
    """The fastest config with the loader as the script declares it and no squares cap (the configs the
    other rules probe)."""
    return next((c for c in ranked if not is_variant(c.config)), None)


def wait_share(config: Config, observations: Sequence[Observation]) -> float | None:
    """The median share of the measured time `config`'s probes waited for data (None: never seen)."""
    shares = sorted(o.data_wait_share for o in observations
                    if o.config == config and o.status == "ok" and o.data_wait_share is not None)
    return shares[len(shares) // 2] if shares else None


def base_of(config: Config) -> Config:
    """`config` with the loader as the script declares it."""
    return replace(config, **dict.fromkeys(LOADER_FIELDS))


def next_loader_config(choices: LoaderChoices, ranked: Sequence[Candidate],
                       observations: Sequence[Observation]) -> Config | None:
    """The next loader variant of the leader to probe, or None when there is none worth probing (or
    one is running: the next step depends on what it measures)."""
    if not choices.offered:
        return None
    base = leader(ranked)
    if base is None:
        return None
    share = wait_share(base.config, observations)
    if share is None or share < MIN_LOADER_SHARE:
        return None
    if any(o.status == "running" and o.config.loader and base_of(o.config) == base.config for o in observations):
        return None
    rates = {c.config: c.rate for c in ranked}
    done = {o.config for o in observations if o.status != "running"}
    best, best_rate = base.config, base.rate
    for step in (_more_workers, _prefetch_further, _pin_memory):
        for config in step(choices, best, share):
            if config not in done:
                return config
            rate = rates.get(config)
            if rate is None or rate < best_rate * _LOADER_GAIN:
                break  # no faster (or failed): the rest of this step is not tried
            best, best_rate = config, rate
    return None


def _more_workers(choices: LoaderChoices, best: Config, share: float) -> list[Config]:
    keep_pace = max(1, math.ceil(share / max(1e-9, 1 - share) - 1e-6))  # (0.8/0.2 is 4.000000000000001)
    above = [w for w in choices.workers if w > choices.declared_workers]
    start = next((w for w in above if w >= keep_pace), above[-1] if above else None)
    return [replace(best, loader_workers=w) for w in above if start is not None and w >= start]


def _prefetch_further(choices: LoaderChoices, best: Config, share: float) -> list[Config]:
    workers = best.loader_workers if best.loader_workers is not None else choices.declared_workers
    return [replace(best, prefetch_factor=p) for p in choices.prefetch_factors if workers > 0]


def _pin_memory(choices: LoaderChoices, best: Config, share: float) -> list[Config]:
    return [replace(best, pin_memory=p) for p in choices.pin_memory]


def loader_reason(choices: LoaderChoices, ranked: Sequence[Candidate],
                  observations: Sequence[Observation]) -> str | None:
    """Why the winner's loader settings were chosen: 'input-bound: 38% of the step waiting for data with
    0 loader workers; 2 loader workers: 1.6x'. None when the winner keeps the script's loader."""
    if not ranked or not ranked[0].config.loader:
        return None
    base = leader(ranked)
    winner = ranked[0]
    if base is None or base_of(winner.config) != base.config:
        return None
    share = wait_share(base.config, observations)
    declared = choices.declared_workers  # the leader runs the loader as the script declares it
    waited = f"{share:.0%} of the step waiting for data" if share is not None else "waiting for data"
    changes = ", ".join(_change(name, value) for name, value in winner.config.loader.items())
    return (f"input-bound: {waited} with {declared} loader workers; {changes}: "
            f"{winner.rate / base.rate:.1f}x")


def _change(name: str, value) -> str:
    if name == "loader_workers":
        return f"{value} loader workers"
    if name == "pin_memory":
        return "pinned memory" if value else "unpinned memory"
    return f"prefetch {value}"
