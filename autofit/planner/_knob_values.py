"""Which values of each knob a search tries, from what the function offers (autofit.knobs' `Offers`), what
the search was asked (`SearchOptions`) and the device. One rule serves every knob (`offered_values`): where
the function offers it, the values the search is told to consider, else every one the device runs; a knob
whose values follow from more than that has its own rule here, keyed by its name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autofit.config import KNOBS, PRECISIONS
from autofit.errors import UsageError
from autofit.knobs import Knob, Offers
from autofit.options import SearchOptions
from autofit.planner._search_space import STRATEGY_KNOBS, checkpoint_levels


@dataclass(frozen=True)
class Asked:
    """What a knob's values follow from: the function's offers, the search's options, the device."""

    offers: Offers
    options: SearchOptions
    device: str
    """The device type ("cpu", "cuda")."""
    world: int = 1
    """Ranks a probe spans."""
    precisions: tuple[str, ...] = PRECISIONS
    """The precisions the device runs."""
    default_precisions: tuple[str, ...] = ("fp32",)
    """The device's own choice of them, its first guess first (the pilot's)."""


def offered_values(knob: Knob, asked: Asked) -> tuple:
    """Every knob's rule: where the function offers it (and, for a knob of several ranks, a probe spans
    them), the values the search is told to consider (`consider`), else every one the device runs, in the
    declaration's order (the default first); elsewhere (or where the device runs none of those) its default alone."""
    if not asked.offers.noted(knob.offer) or (knob.ranks and asked.world <= 1):
        return (knob.default,)
    declared = [v for v in knob.trial_values() if v is not None]
    runs = (asked.options.considered(knob.name, asked.device) if knob.consider
            else knob.device_values(asked.device) if knob.choices or knob.supported else declared)
    offered = getattr(asked.offers, knob.offer)
    if isinstance(offered, (list, tuple)):  # the offer names the values that run the function (its kernels)
        runs = [v for v in runs if v in offered]
    return tuple(v for v in declared if v in runs) or (knob.default,)


def _precisions(knob: Knob, asked: Asked) -> tuple:
    """Those asked for (the device's by default) that the device runs, the pilot's (the device's first
    guess) first; fp32 alone where the function never enters run.autocast() (precision changes nothing:
    it computes in fp32, as the memory estimator assumes), and tf32 without fp32 where the function turns
    TF32 on itself (its fp32 runs TF32 math: one of them, named for what runs)."""
    wanted = asked.options.precision or asked.default_precisions
    unsupported = [p for p in wanted if p not in asked.precisions]
    if unsupported:
        raise UsageError(f"The precision must be one the device runs ({', '.join(asked.precisions)}), "
                         f"but got {', '.join(unsupported)}.")
    if asked.offers.forces_tf32 and "tf32" in wanted and "fp32" in wanted:
        wanted = tuple(p for p in wanted if p != "fp32")
    if not asked.offers.noted(knob.offer):
        wanted = ("fp32",) if "fp32" in wanted else wanted[:1]
    first = next((p for p in asked.default_precisions if p in wanted), None)
    return tuple(sorted((p for p in PRECISIONS if p in wanted), key=lambda p: p != first))


def _checkpoint_levels(knob: Knob, asked: Asked) -> tuple:
    """0, about a quarter, half and all of the blocks offered to run.checkpoint() (`checkpoint_levels`)."""
    return tuple(checkpoint_levels(asked.offers.checkpoint_blocks)) if asked.options.checkpoint else (0,)


def _accumulations(knob: Knob, asked: Asked) -> tuple:
    """Those asked for, where the function calls run.backward() (a global batch derives them instead by samples:
    `SearchSpace.build`)."""
    return tuple(sorted(set((asked.options.accumulation if asked.offers.noted(knob.offer) else None) or (1,))))


def _compiles(knob: Knob, asked: Asked) -> tuple:
    """Eager, and compiled too where the function offers run.compile() and the search may compile."""
    return offered_values(knob, asked) if asked.options.compile else (knob.default,)


#: The knobs whose values follow from more than the common rule, by name.
_RULES: dict[str, Callable[[Knob, Asked], tuple]] = {
    "precision": _precisions, "checkpoint_segments": _checkpoint_levels, "accumulation_steps": _accumulations,
    "compile": _compiles}


def knob_values(asked: Asked) -> dict[str, tuple]:
    """Each strategy knob's values to try (SearchSpace.build's), by name, the pilot's first."""
    return {k.name: _RULES.get(k.name, offered_values)(k, asked) for k in STRATEGY_KNOBS}


def compute_variants(asked: Asked) -> tuple[tuple[str, tuple], ...]:
    """The knobs of order "compute" the function offers, each with its values other than its default (the
    common rule's): each tried on the leader (rule 11)."""
    values = {k.name: tuple(v for v in offered_values(k, asked) if v != k.default) for k in KNOBS if k.order == "compute"}
    return tuple((name, tried) for name, tried in values.items() if tried)
