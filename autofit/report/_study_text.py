"""Text for `autofit show` and `autofit studies`: the probes as a table, one probe in full, the studies."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pandas as pd

from autofit.config import RATES, SAMPLES, Rate
from autofit.errors import NoFeasibleConfig, UsageError
from autofit.forecast import PRICES_DATE
from autofit.probing import STATUSES, input_bound_text
from autofit.report._forecast_text import forecast_table, study_forecast
from autofit.report._memory_text import describe_memory
from autofit.report._probe_text import confirmation_words, describe_probe, rate_text, work_text
from autofit.study import COLUMNS, redacted
from autofit.units import format_duration, format_size

if TYPE_CHECKING:
    from autofit.findings import StoredStudy

#: Friendly --sort names for frame columns ("throughput": the study's rate, see `select_probes`). The rates
#: sort highest first, the rest lowest first.
SORT_ALIASES = {"peak": "peak_bytes", "memory": "peak_bytes", "wall": "wall_s", "batch": "batch_size", "time": "started"}
SORT_NAMES = ("throughput", "trial", "peak", "wall", "batch", "status", "phase", "precision")
TAIL_LINES = 40


def select_probes(frame: pd.DataFrame, sort: str = "throughput", reverse: bool = False,
                  status: tuple[str, ...] = (), phase: tuple[str, ...] = (), top: int | None = None,
                  ranked_by: Rate = SAMPLES) -> pd.DataFrame:
    """Filter then sort then cut: the rows `autofit show` prints; "throughput" is the study's rate
    (`StoredStudy.ranked_by`: samples/s, or real tokens/s by tokens)."""
    column = ranked_by.name if sort == "throughput" else SORT_ALIASES.get(sort, sort)
    if column not in COLUMNS:
        raise UsageError(f"--sort must be one of {', '.join(SORT_NAMES)} (or a column of the probes frame), "
                         f"but got {sort!r}.")
    if status:
        frame = frame[frame["status"].isin(status)]
    if phase:
        frame = frame[frame["phase"].isin(phase)]
    descending = column in (r.name for r in RATES)
    frame = frame.sort_values([column, "trial"], ascending=[descending == reverse, True], na_position="last",
                              kind="stable")
    return frame.head(top) if top is not None else frame


def _na(value: Any) -> bool:
    return value is None or bool(pd.isna(value))


def probes_table(frame: pd.DataFrame, winner_label: str | None = None, ranked_by: Rate = SAMPLES) -> str:
    """The table: config, status, throughput (the study's rate), peak memory, % of limit, wall time, its start
    (before its first micro-batch ended: set-up, the script's own evaluation, compilation), and an error. The
    winner's first row is starred, once, whatever its knobs (`Config.label()`, the frame's `label`)."""
    head = f"{'':2}{'trial':>5}  {'phase':<9} {'config':<24} {'status':<9}{ranked_by.unit:>10}{'peak':>14}" \
           f"{'% limit':>9}{'wall':>8}{'start':>8}"
    lines = [head]
    starred = False
    for row in frame.itertuples(index=False):
        label = row.label
        over = row.status == "ok" and not row.feasible
        winner = label == winner_label and not starred and row.status == "ok"
        starred = starred or winner
        mark = "* " if winner else "! " if over else "  "
        value = getattr(row, ranked_by.name)
        rate = "-" if _na(value) else f"{value:,.1f}"
        if row.status == "oom":
            peak = "> " + format_size(row.limit_bytes) if not _na(row.limit_bytes) else "-"
            share = "> 100%"
        else:
            peak = "-" if _na(row.peak_bytes) else format_size(row.peak_bytes)
            share = "-" if _na(row.peak_fraction) else f"{100 * row.peak_fraction:.0f}%"
        start = "-" if _na(row.start_s) else format_duration(row.start_s)  # before its first micro-batch ended
        line = (f"{mark}{row.trial:>5}  {row.phase:<9} {label:<24} {row.status:<9}{rate:>10}{peak:>14}"
                f"{share:>9}{format_duration(row.wall_s):>8}{start:>8}")
        if row.status not in ("ok", "oom") and not _na(row.error):
            line += f"  {row.error[:70]}"
        lines.append(line)
    return "\n".join(lines)


def describe_study(stored: StoredStudy, shown: pd.DataFrame, total: pd.DataFrame) -> str:
    """Header, the selected probes, then the winner and why it won."""
    meta = stored.meta
    counts = total["status"].value_counts()
    over = int(((total["status"] == "ok") & ~total["feasible"].fillna(False)).sum())
    failed = sum(int(counts.get(s, 0)) for s in STATUSES if s not in ("ok", "oom"))
    script = f"{os.path.basename(meta.script)}:{meta.function}" if meta.function else meta.script
    lines = [
        f"study {stored.name} ({redacted(stored.storage)})",
        f"{script} on {meta.device_name}, limit {format_size(stored.memory.limit_bytes)}, "
        f"usable {format_size(stored.memory.usable_bytes)} ({stored.memory.headroom:.0%} headroom)",
        f"{len(total)} probes: {int(counts.get('ok', 0))} ran ({over} over the headroom), "
        f"{int(counts.get('oom', 0))} out of memory, {failed} failed"
        + (f"; showing {len(shown)}" if len(shown) != len(total) else ""),
        "",
    ]
    try:
        document = stored.document()
    except NoFeasibleConfig:
        document = None
    winner = document.config.label() if document else None
    lines.append(probes_table(shown, winner, stored.ranked_by) if len(shown) else "(no probe matches the filters)")
    lines.append("")
    if document is None:
        lines.append("best: none yet: no probe fits under the usable memory")
        return "\n".join(lines)
    measured = document.measured
    confirmed = confirmation_words(measured)
    if measured.rate_from == "confirmation":
        confirmed += ", whose figure this is"
    lines.append(f"best: {winner}  {rate_text(measured)}, peak "
                 f"{format_size(measured.peak_bytes)} of {format_size(stored.memory.usable_bytes)} usable "
                 f"({measured.probes} probe{'s' if measured.probes != 1 else ''}, {confirmed})")
    if measured.flops_per_s:
        lines.append(f"work: {work_text(measured.flops_per_s, measured.mfu, measured.joules_per_sample)}")
    if waited := input_bound_text(measured.data_wait_share):
        lines.append(waited)
    lines.append(f"why: {document.why}")
    lines.append(f"stopped: {document.study.stopped if document.study else None}")
    lines.append("legend: * the best config   ! ran, but its peak crossed the headroom (infeasible)")
    if (forecast := study_forecast(stored)) is not None:
        lines += [f"forecast for other GPUs (prices of {PRICES_DATE}; `autofit forecast {stored.name}` for the "
                  "notes, --gpu, --price and --tokens):", *forecast_table(forecast)]
    return "\n".join(lines)


def describe_trial(stored: StoredStudy, number: int, full: bool = False, tail: int = TAIL_LINES) -> str:
    """One probe in full: its measurements, error and traceback, then its captured output."""
    trial, result = stored.probe(number)
    phase = trial.user_attrs.get("phase", "explore")
    started = f", started {trial.datetime_start:%Y-%m-%d %H:%M:%S}" if trial.datetime_start else ""
    path = stored.log_path(number)
    stored_path = result.log_path
    result.log_path = path or stored_path
    lines = [describe_probe(result, header=f"trial {trial.number} of study {stored.name} ({phase}{started})")]
    if result.status == "ok" and result.peak_bytes and result.peak_bytes > stored.memory.usable_bytes:
        lines.append(f"{'feasible':<12} no: the peak crosses {format_size(stored.memory.usable_bytes)} usable")
    parts = stored.where_memory_goes(result.config, result.peak_bytes if result.status == "ok" else None)
    if parts is not None:
        lines += ["", *describe_memory(parts, stored.memory,
                                       result.peak_bytes if result.status == "ok" else None)]
    lines.append("")
    if path is None:
        where = f": {stored_path} is gone" if stored_path else ""
        lines.append(f"output: not available{where}")
        return "\n".join(lines)
    with open(path, errors="replace") as handle:
        text = handle.read().rstrip("\n")
    if not text.strip():
        lines.append(f"output ({path}): the probe printed nothing")
        return "\n".join(lines)
    out = text.splitlines()
    if full or len(out) <= tail:
        lines.append(f"output ({path}, {len(out)} lines):")
    else:
        lines.append(f"output ({path}, last {tail} of {len(out)} lines; --full for all):")
        out = out[-tail:]
    lines.extend(out)
    return "\n".join(lines)


def studies_table(rows: list[dict[str, Any]]) -> str:
    """`autofit studies`: one line per study."""
    if not rows:
        return "(no studies)"
    width = max(len("study"), *(len(r["study"]) for r in rows))
    lines = [f"{'study':<{width}}  {'device':<22}{'limit':>12}{'probes':>8}  {'best':<28}{'throughput':>20}"]
    for r in rows:
        limit = format_size(r["limit_bytes"]) if r["limit_bytes"] else "-"
        rate = f"{r['rate']:,.1f} {r['rate_unit']}" if r["rate"] else "-"
        lines.append(f"{r['study']:<{width}}  {(r['device'] or '-')[:21]:<22}{limit:>12}{r['probes']:>8}  "
                     f"{r['best'] or '-':<28}{rate:>20}")
    return "\n".join(lines)
