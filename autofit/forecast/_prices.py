"""What a GPU-hour costs: a dated input with a default, never a constant.

On-demand prices in US dollars per GPU-hour, late 2026 (autofit's sixth survey, 2026-11-28: public price
pages of cloud and GPU-rental sellers; AWS p5 is 6.88 per H100). The seller moves the price more than
the GPU does (the H100 spans 4.6x between the cheapest and the dearest), so each GPU has a low price
(the cheapest seller found) and a typical one, the geometric middle of the cheapest and the dearest
found; a forecast shows the cost at both. A GPU with no price found has none: give one with --price.
"""

from __future__ import annotations

from dataclasses import dataclass

PRICES_DATE = "2026-11-28"
PRICES_SOURCE = "autofit's survey of on-demand prices, 2026-11-28 (docs/guide/forecast.md)"


@dataclass(frozen=True)
class Price:
    """$/GPU-hour: the low (cheapest seller found) and typical one, and where they come from."""

    low: float
    typical: float
    source: str

    def to_dict(self) -> dict[str, object]:
        return {"low": self.low, "typical": self.typical, "source": self.source}


def _surveyed(low: float, high: float) -> Price:
    return Price(low, round((low * high) ** 0.5, 2), f"{PRICES_SOURCE}: {low:.2f}-{high:.2f} $/h")


#: GPU (as autofit.forecast's GPUS names it) to its price; the range found is in each one's source.
PRICES: dict[str, Price] = {
    "A100-80GB": _surveyed(1.39, 3.43),
    "H100": _surveyed(2.40, 12.29),
    "H200": _surveyed(3.45, 5.41),
    "B200": _surveyed(5.00, 7.15),
    "L4": _surveyed(0.44, 0.80),
}


def price_for(gpu: str, overrides: dict[str, float] | None = None) -> Price | None:
    """The price a forecast uses for `gpu`: the user's (--price GPU=$/h, low and typical alike), else the
    table's, else None."""
    if overrides and gpu in overrides:
        value = overrides[gpu]
        return Price(value, value, "given with --price")
    return PRICES.get(gpu)
