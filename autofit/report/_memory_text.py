"""Where a config's memory goes, as text: one stacked bar from zero to the limit, then the parts.

The parts come from the memory estimator (predicted tensors by kind) and, for a probed config, the
rest of its measured peak; the bar marks the usable memory and the limit, so a reader sees at once
which part to cut (activations: checkpoint or a smaller batch; optimizer state: shard it) and how
close the config runs to the edge.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autofit.units import format_size

if TYPE_CHECKING:
    from autofit.export import MemoryBudget

#: One character per part in the bar, and its name in the legend.
SYMBOLS = {"parameters": ("P", "parameters"), "gradients": ("G", "gradients"), "optimizer": ("O", "optimizer state"),
           "activations": ("A", "activations"), "temporaries": ("T", "temporaries"), "other": ("o", "other tensors"),
           "device": ("#", "device and allocator (measured peak less the tensors)")}


def memory_bar(parts: dict[str, float], budget: MemoryBudget, width: int = 60) -> str:
    """`[PPGGOOAAAAAAAA####      :   ]`: each part's share of the limit; ':' marks the usable memory."""
    scale = width / max(budget.limit_bytes, sum(parts.values()), 1.0)
    cells: list[str] = []
    for part, value in parts.items():
        cells += [SYMBOLS[part][0]] * round(value * scale)
    cells = (cells + [" "] * width)[:max(width, len(cells))]
    mark = min(len(cells) - 1, int(budget.usable_bytes * scale))
    if cells[mark] == " ":
        cells[mark] = ":"
    return "[" + "".join(cells[:width]) + "]" + "".join(cells[width:])


def describe_memory(parts: dict[str, float], budget: MemoryBudget, measured_peak: float | None) -> list[str]:
    """The bar and one line per part: bytes and share of the peak."""
    total = sum(parts.values())
    lines = ["where the memory goes (tensors predicted by the memory estimator; 'device' is the measured rest):",
             f"  {memory_bar(parts, budget)}  0 to the {format_size(budget.limit_bytes)} limit, ':' at "
             f"{format_size(budget.usable_bytes)} usable"]
    for part, value in parts.items():
        if value <= 0:
            continue
        symbol, name = SYMBOLS[part]
        lines.append(f"  {symbol} {name:<52} {format_size(value):>12}  {value / total:6.1%}" if total else "")
    peak = f"measured peak {format_size(measured_peak)}" if measured_peak else \
        f"predicted tensors {format_size(total)} (not probed: the device adds its own)"
    lines.append(f"  {peak}")
    return lines
