"""The study plots, as matplotlib Figures drawn from the probes frame (the report and notebook share them).

Figures are built without pyplot (no global state, no GUI): the Agg canvas renders them to PNG, and
a notebook displays them as they are. Each answers one question:

- throughput_figure: how fast is each strategy (precision x checkpointed blocks) at each batch size?
- memory_figure: how much memory does each need, against the limit, the headroom and the planner's
  fitted memory line; where did probes run out of memory?
- progress_figure: how quickly did the search find its winner (best feasible throughput so far
  against the probe-seconds spent)?
- ranking_figure: how far ahead of its runner-ups is the winner?
- memory_parts_figure: where does the memory of the winner and its runner-ups go?
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import numpy as np

from autofit.config import PRECISIONS, SAMPLES, TOKENS
from autofit.errors import UsageError

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from autofit.config import Rate
    from autofit.export import MemoryBudget
    from autofit.findings import StoredStudy
    from autofit.planner import Candidate, Line

SIZE = (8.6, 4.4)  # inches; 110 dpi gives 946 x 484 px
DPI = 110
OOM_COLOR = "#d62728"
LIMIT_COLOR = "#d62728"
USABLE_COLOR = "#ff7f0e"
PHASE_COLORS = {"explore": "#7f7f7f", "recheck": "#ff7f0e", "remeasure": "#1f77b4", "confirm": "#2ca02c"}
_PALETTE = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
            "#aec7e8", "#98df8a", "#c5b0d5", "#c49c94"]


def _figure() -> Figure:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError("The report needs matplotlib, but it is not installed: pip install 'torch-autofit[report]' (or -e '.[report]' in a checkout).") from None
    fig = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (rendered by Agg)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def strategy_labels(frame: pd.DataFrame, global_batch: int | None = None) -> pd.Series:
    """A strategy per probe: its config's label (`Config.label()`, every knob) without its size, and without
    its accumulation where a global batch fixes it (it follows from the micro-batch). A squares cap, a
    compiled, sharded or loader variant is a curve of its own."""
    import pandas as pd

    def strategy(label: str) -> str:
        return " ".join(part for part in str(label).split() if not part.startswith(("b=", "max_tokens="))
                        and not (global_batch is not None and part.startswith("acc=")))

    return pd.Series([strategy(label) for label in frame["label"]], index=frame.index, dtype="string")


def strategy_colors(labels) -> dict[str, str]:
    """One color per strategy, stable across the plots (precision order, then fewer blocks first)."""
    def key(label: str) -> tuple:
        parts = label.split()
        precision = PRECISIONS.index(parts[0]) if parts[0] in PRECISIONS else len(PRECISIONS)
        return (precision, label.count("ckpt"), label)

    unique = sorted({str(x) for x in labels}, key=key)
    return {label: _PALETTE[i % len(_PALETTE)] for i, label in enumerate(unique)}


def size_name(ranked_by: Rate) -> str:
    """What the x axis climbs: the micro-batch size, or by tokens the token cap."""
    return "token cap (max_tokens)" if ranked_by == TOKENS else "micro-batch size"


def _batch_axis(ax: Axes, batches, ranked_by: Rate = SAMPLES) -> None:
    """Batch sizes (or token caps) are powers of two and their halves: a log2 axis with plain-number ticks."""
    from matplotlib.ticker import FixedLocator, NullLocator

    values = sorted({int(b) for b in batches}) or [1]
    ax.set_xscale("log", base=2)
    low, high = values[0], values[-1]
    ticks = [2**k for k in range(0, 16) if low / 1.5 <= 2**k <= high * 1.5] or values
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(t) for t in ticks])
    ax.set_xlim(low / 1.4, high * 1.4)
    ax.set_xlabel(f"{size_name(ranked_by)} (log scale)")


def _memory_unit(memory_limit: float) -> tuple[float, str]:
    return (2**30, "GiB") if memory_limit >= 2 * 2**30 else (2**20, "MiB")


def throughput_figure(frame: pd.DataFrame, global_batch: int | None = None, winner: str | None = None,
                      ranked_by: Rate = SAMPLES) -> Figure:
    """The study's rate (samples/s, or real tokens/s by tokens) against batch size, one line per strategy;
    OOMs as crosses on the axis."""
    fig = _figure()
    ax = fig.add_subplot()
    rate = ranked_by.name
    frame = frame.assign(strategy=strategy_labels(frame, global_batch))
    colors = strategy_colors(frame["strategy"])
    top = float(frame[rate].max()) if frame[rate].notna().any() else 1.0
    for label, group in frame.groupby("strategy", sort=False):
        color = colors[str(label)]
        ran = group[group["status"] == "ok"]
        if len(ran):
            medians = ran.groupby("batch_size")[rate].median().sort_index()
            ax.plot(medians.index, medians.values, "-o", color=color, alpha=0.6, ms=4, label=str(label))
            fits, over = ran[ran["feasible"].fillna(False)], ran[~ran["feasible"].fillna(False)]
            ax.plot(fits["batch_size"], fits[rate], "o", color=color, ms=6)
            ax.plot(over["batch_size"], over[rate], "o", mfc="white", mec=color, ms=6)
        ooms = group[group["status"] == "oom"]
        if len(ooms):
            ax.plot(ooms["batch_size"], [0] * len(ooms), "x", color=color, ms=9, mew=2.2, clip_on=False,
                    label=None if len(ran) else str(label))
    _legend_markers(ax, frame)
    if winner is not None:
        best = frame[(config_labels(frame) == winner) & (frame["status"] == "ok")]
        if len(best):
            y = float(best[rate].median())
            b = int(best["batch_size"].iloc[0])
            ax.plot([b], [y], "*", color="gold", mec="black", ms=17, zorder=5)
            ax.annotate(f"best: {winner}", (b, y), xytext=(-14, 14), textcoords="offset points", ha="right",
                        fontsize=9, fontweight="bold", bbox={"boxstyle": "round", "fc": "white", "ec": "0.7"})
    _batch_axis(ax, frame["batch_size"], ranked_by)
    ax.set_ylim(0, top * 1.18)
    ax.set_ylabel(f"throughput ({ranked_by.unit})")
    ax.set_title(f"Throughput against {size_name(ranked_by)}, per strategy")
    ax.grid(alpha=0.3)
    _legend(ax)
    return fig


def _legend(ax: Axes) -> None:
    """A legend beside the axes (never over a point) when something is labelled; a note in the
    middle when nothing was drawn."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    if not ax.has_data():
        ax.text(0.5, 0.5, "no probe to show", transform=ax.transAxes, ha="center", color="0.5")


def _legend_markers(ax: Axes, frame: pd.DataFrame) -> None:
    """Entries for the marker kinds (not colors): fits, over the headroom, out of memory."""
    if (frame["status"] == "oom").any():
        ax.plot([], [], "x", color="black", mew=2, label="out of memory")
    if ((frame["status"] == "ok") & ~frame["feasible"].fillna(False)).any():
        ax.plot([], [], "o", mfc="white", mec="black", label="ran, over the headroom")


def memory_figure(frame: pd.DataFrame, budget: MemoryBudget, models: dict[str, Line] | None = None,
                  global_batch: int | None = None, ranked_by: Rate = SAMPLES) -> Figure:
    """Peak memory against batch size per strategy, with the limit, the usable line (limit less the
    headroom) and the planner's memory model; OOM probes as crosses on the limit line."""
    memory_limit, usable_bytes = budget.limit_bytes, budget.usable_bytes
    fig = _figure()
    ax = fig.add_subplot()
    unit, name = _memory_unit(memory_limit)
    frame = frame.assign(strategy=strategy_labels(frame, global_batch))
    colors = strategy_colors(list(frame["strategy"]) + list(models or {}))
    batches = frame["batch_size"].astype(float)
    grid = np.geomspace(max(1.0, batches.min() / 1.4), batches.max() * 1.4, 120) if len(frame) else np.array([1.0])
    for label, line in (models or {}).items():
        ys = np.array([line(b) for b in grid]) / unit
        shown = ys <= memory_limit * 1.25 / unit
        ax.plot(grid[shown], ys[shown], "--", color=colors[label], lw=1.2, alpha=0.8)
    for label, group in frame.groupby("strategy", sort=False):
        color = colors[str(label)]
        ran = group[(group["status"] == "ok") & group["peak_bytes"].notna()]
        fits, over = ran[ran["feasible"].fillna(False)], ran[~ran["feasible"].fillna(False)]
        ax.plot(fits["batch_size"], fits["peak_bytes"].astype(float) / unit, "o", color=color, ms=6, label=str(label))
        ax.plot(over["batch_size"], over["peak_bytes"].astype(float) / unit, "o", mfc="white", mec=color, ms=6)
        ooms = group[group["status"] == "oom"]
        ax.plot(ooms["batch_size"], [memory_limit / unit] * len(ooms), "x", color=color, ms=10, mew=2.2, zorder=4)
    ax.axhline(memory_limit / unit, color=LIMIT_COLOR, lw=1.6, label=f"limit {memory_limit / unit:,.0f} {name}")
    headroom = 1 - usable_bytes / memory_limit if memory_limit else 0
    ax.axhline(usable_bytes / unit, color=USABLE_COLOR, lw=1.4, ls="-.",
               label=f"usable {usable_bytes / unit:,.0f} {name} ({headroom:.0%} headroom)")
    if models:
        ax.plot([], [], "--", color="black", lw=1.2, label="memory model (planner's fit)")
    _legend_markers(ax, frame)
    _batch_axis(ax, frame["batch_size"], ranked_by)
    peaks = frame["peak_bytes"].dropna().astype(float)
    ax.set_ylim(0, max(memory_limit * 1.12, float(peaks.max()) * 1.05 if len(peaks) else 0) / unit)
    ax.set_ylabel(f"peak memory ({name})")
    ax.set_title(f"Peak memory against {size_name(ranked_by)}, per strategy")
    ax.grid(alpha=0.3)
    _legend(ax)
    return fig


def progress_figure(frame: pd.DataFrame, progress: pd.DataFrame, ranked_by: Rate = SAMPLES) -> Figure:
    """Each probe's throughput (the study's rate) at the probe-seconds when it ended, and the best feasible
    so far."""
    rate = ranked_by.name
    fig = _figure()
    ax = fig.add_subplot()
    ordered = frame.sort_values("trial").assign(probe_seconds=lambda f: f["wall_s"].cumsum())
    for phase, color in PHASE_COLORS.items():
        rows = ordered[(ordered["phase"] == phase) & (ordered["status"] == "ok")]
        if len(rows):
            ax.plot(rows["probe_seconds"], rows[rate], "o", color=color, ms=5, alpha=0.8,
                    label=f"{phase} probe")
    ooms = ordered[ordered["status"] != "ok"]
    if len(ooms):
        ax.plot(ooms["probe_seconds"], [0] * len(ooms), "x", color=OOM_COLOR, ms=8, mew=2, clip_on=False,
                label="out of memory / failed")
    if len(progress):
        xs = [0.0, *progress["probe_seconds"]]
        ys = [float("nan"), *progress["best_rate"]]
        ax.step(xs, ys, where="post", color="black", lw=2, label="best feasible so far")
        last = progress.dropna(subset=["best_rate"])
        if len(last):
            end = last.iloc[-1]
            found = last[last["best"] == end["best"]].iloc[0]
            late = found["probe_seconds"] > 0.6 * float(ordered["wall_s"].sum())  # keep the text inside
            ax.annotate(f"{end['best']}\nfound after {found['probe_seconds']:.0f} s", (found["probe_seconds"],
                        found["best_rate"]), xytext=(-8 if late else 8, -28), textcoords="offset points",
                        ha="right" if late else "left", fontsize=9)
    top = float(ordered[rate].max()) if ordered[rate].notna().any() else 1.0
    ax.set_ylim(0, top * 1.15)
    ax.set_xlim(0, max(1.0, float(ordered["wall_s"].sum())) * 1.03)
    ax.set_xlabel("probe-seconds spent (cumulative wall time of the probes)")
    ax.set_ylabel(f"throughput ({ranked_by.unit})")
    ax.set_title("Search progress: best feasible throughput so far")
    ax.grid(alpha=0.3)
    _legend(ax)
    return fig


def ranking_figure(ranked: list[Candidate], usable_bytes: float, count: int = 6) -> Figure:
    """The winner and its runner-ups as bars, each labelled with its peak memory."""
    fig = _figure()
    ax = fig.add_subplot()
    shown = ranked[:count][::-1]
    labels = [c.config.label() for c in shown]
    rates = [c.rate for c in shown]
    colors = ["#bbbbbb"] * (len(shown) - 1) + ["#2ca02c"] if shown else []
    ax.barh(labels, rates, color=colors)
    top = max(rates, default=1.0)
    unit, name = _memory_unit(usable_bytes)
    for i, c in enumerate(shown):
        peak = f"{c.peak_bytes / unit:,.0f} {name}" if c.peak_bytes else "-"
        share = f"{c.rate / ranked[0].rate:.0%}"
        ax.text(c.rate + top * 0.01, i, f"{c.rate:,.1f}/s ({share}), peak {peak}",
                va="center", fontsize=8)
    if not shown:
        ax.text(0.5, 0.5, "no feasible config", transform=ax.transAxes, ha="center", color="0.5")
    ax.set_xlim(0, top * 1.45)
    unit = ranked[0].config.ranked_by.unit if ranked else "samples/s"
    ax.set_xlabel(f"throughput ({unit}, median over the config's probes)")
    ax.set_title("The winner (green) and its runner-ups")
    ax.grid(axis="x", alpha=0.3)
    return fig


#: The parts of a config's peak, in stacking order, with their colours.
PART_COLORS = {"parameters": "#1f77b4", "gradients": "#aec7e8", "optimizer": "#9467bd",
               "activations": "#2ca02c", "temporaries": "#98df8a", "other": "#bcbd22", "device": "#c7c7c7"}


def memory_parts_figure(stored: StoredStudy, count: int = 6) -> Figure:
    """Where the memory goes: the winner and its runner-ups as stacked bars (predicted tensors by
    part, then the rest of the measured peak), against the usable memory and the limit."""
    fig = _figure()
    ax = fig.add_subplot()
    limit, usable = stored.memory.limit_bytes, stored.memory.usable_bytes
    unit, name = _memory_unit(limit)
    shown = [(c, stored.where_memory_goes(c.config, c.peak_bytes)) for c in stored.ranked()[:count]][::-1]
    shown = [(c, parts) for c, parts in shown if parts is not None]
    for i, (candidate, parts) in enumerate(shown):
        left = 0.0
        for part, color in PART_COLORS.items():
            value = parts.get(part, 0.0) / unit
            if value > 0:
                ax.barh(i, value, left=left, color=color, label=part if i == 0 else None)
                left += value
    ax.set_yticks(range(len(shown)), [c.config.label() for c, _ in shown])
    ax.axvline(usable / unit, color=USABLE_COLOR, linestyle="--", label="usable")
    ax.axvline(limit / unit, color=LIMIT_COLOR, label="limit")
    if not shown:
        why = "no memory estimates (searched with --no-estimate, or the estimator had none)" \
            if stored.estimates is None or not stored.estimates.breakdowns else "no feasible config"
        ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", color="0.5")
    ax.set_xlim(0, limit / unit * 1.05)
    ax.set_xlabel(f"memory ({name}): tensors predicted by the estimator, the rest of the measured peak in grey")
    ax.set_title("Where the memory goes (winner at the top)")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def study_figures(stored: StoredStudy) -> dict[str, Figure]:
    """The five figures of a study, keyed by their PNG file stem."""
    frame = stored.trials_frame()
    global_batch = stored.space.global_batch
    best = stored.best()
    models = {s.label(): line for s, line in stored.memory_models().items()}
    return {
        "throughput": throughput_figure(frame, global_batch, winner=best.label() if best else None,
                                        ranked_by=stored.ranked_by),
        "memory": memory_figure(frame, stored.memory, models, global_batch, stored.ranked_by),
        "progress": progress_figure(frame, stored.progress(), stored.ranked_by),
        "ranking": ranking_figure(stored.ranked(), stored.memory.usable_bytes),
        "memory_parts": memory_parts_figure(stored),
    }


def config_labels(frame: pd.DataFrame) -> pd.Series:
    """Config.label() per row ('bf16 b=64 ckpt=2 compiled'), to match probes against the winner."""
    return frame["label"]
