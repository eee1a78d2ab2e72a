"""Rule 11 of the planner: a knob that changes a step's speed and not what fits (its `order` is "compute" in
autofit.knobs: a memory format, say) is tried on the fastest config, where the function offers it, once
the loader has had its turn; each of its other values in turn, kept where it is faster. Declaring such a knob
is all it takes to have it searched: this rule reads the space's `variants`, the knobs the function offered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from autofit.config import Config
from autofit.planner._observation import Observation, compute_variant
from autofit.planner._ranking import Candidate

#: A variant must be this much faster than the best so far to be kept (a probe's noise is a few percent).
_GAIN = 1.03


def next_variant_config(variants: Sequence[tuple[str, tuple]], ranked: Sequence[Candidate],
                        observations: Sequence[Observation]) -> Config | None:
    """The next value of a compute knob (`variants`: each knob's name and its values to try) to probe on the
    fastest config that sets none of them, or None when each was tried (or one is running: the next depends on
    what it measures)."""
    if not variants:
        return None
    base = next((c for c in ranked if not compute_variant(c.config)), None)
    if base is None:
        return None
    if any(o.status == "running" and compute_variant(o.config) for o in observations):
        return None
    done = {o.config for o in observations if o.status != "running"}
    rates = {c.config: c.rate for c in ranked}
    best, best_rate = base.config, base.rate
    for name, values in variants:
        for value in values:
            config = replace(best, **{name: value})
            if config not in done:
                return config
            rate = rates.get(config)
            if rate is not None and rate >= best_rate * _GAIN:
                best, best_rate = config, rate
    return None
