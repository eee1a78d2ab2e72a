"""How probed configs rank: the median throughput of each (its confirmation run's once it has one; when
rechecking noise, the rate the noise reading trusts: `NoiseReading.measurement`), feasible ones only,
near-ties won by a config that did not need allocator retries, then by the lower peak."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autofit.config import Config
from autofit.planner._noise import Measurement, NoiseReading
from autofit.planner._observation import Observation

#: Configs within this fraction of the best throughput are ties, won by the lower peak.
TIE_TOLERANCE = 0.02


@dataclass(frozen=True)
class Candidate:
    """A feasible config with its measured throughput (see `measurement`) and peak."""

    config: Config
    samples_per_s: float
    peak_bytes: int | None
    probes: int
    tight: bool = False  # some probe of it needed allocator retries: it only just fits
    measurement: Measurement | None = None
    """The probes its throughput (and every rate of the best-config file) comes from."""


class Ranking:
    """The measured configs and the feasible ones best first, computed once per reading."""

    def __init__(self, usable: float, by_config: Mapping[Config, Sequence[Observation]], noise: NoiseReading,
                 check_noise: bool) -> None:
        self.usable = usable
        self.by_config = by_config
        self.noise = noise
        self.check_noise = check_noise
        self._measured: list[Candidate] | None = None
        self._ranked: list[Candidate] | None = None

    def measured(self) -> list[Candidate]:
        """Every config that ran its steps (inside the headroom or not), with its measured throughput.

        Suspect measurements (see _noise.py) are left out until a recheck resolves them, so they
        neither win nor bound other strategies; unless nothing else was measured."""
        if self._measured is not None:
            return self._measured
        trusted = [c for c in self.by_config if not (self.check_noise and self.noise.is_unresolved(c))]
        if not any(o.status == "ok" for c in trusted for o in self.by_config[c]):
            trusted = list(self.by_config)
        out = []
        for config in trusted:
            obs = self.by_config[config]
            ok = [o for o in obs if o.status == "ok" and o.samples_per_s]
            if ok:
                # the peak: the highest any of its probes reached (a run must fit all of them)
                peaks = [o.peak_bytes for o in ok if o.peak_bytes is not None]
                measurement = self.noise.measurement(config) if self.check_noise else Measurement.of(ok)
                out.append(Candidate(config, measurement.samples_per_s, max(peaks) if peaks else None, len(ok),
                                     any(o.tight for o in ok), measurement))
        self._measured = out
        return out

    def ranked(self) -> list[Candidate]:
        """Feasible configs, best first: throughput, with near-ties broken toward configs that did
        not need allocator retries, then toward lower peak."""
        if self._ranked is None:
            feasible = [
                c for c in self.measured()
                if not any(o.too_big(self.usable) or o.failed for o in self.by_config[c.config])
            ]
            feasible.sort(key=lambda c: -c.samples_per_s)
            if feasible:
                top = feasible[0].samples_per_s
                ties = [c for c in feasible if c.samples_per_s >= top * (1 - TIE_TOLERANCE)]
                rest = [c for c in feasible if c not in ties]
                ties.sort(key=lambda c: (c.tight, c.peak_bytes or 0, -c.samples_per_s))
                feasible = ties + rest
            self._ranked = feasible
        return self._ranked
