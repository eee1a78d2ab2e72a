"""`autofit report`: one self-contained HTML page per study (plots embedded as data URIs).

Self-contained so it can be mailed, attached to a CI run or opened from disk: no server, no
scripts, no external stylesheet or image.
"""

from __future__ import annotations

import base64
import html
import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from autofit.errors import NoFeasibleConfig
from autofit.forecast import PRICES_DATE, Forecast
from autofit.probing import input_bound_text
from autofit.report._forecast_text import study_forecast
from autofit.report._probe_text import confirmation_words, rate_text, work_text
from autofit.study import redacted
from autofit.units import format_duration, format_size

if TYPE_CHECKING:
    import pandas as pd

    from autofit.config import Rate
    from autofit.export import BestConfig
    from autofit.findings import StoredStudy

#: (PNG stem, section title, how to read it); the stems are those of autofit.report._plots.study_figures.
SECTIONS = (
    ("throughput", "Throughput against batch size",
     "One line per strategy (precision and checkpointed blocks). Filled dots fit under the usable memory, "
     "hollow ones ran but crossed the headroom, crosses on the axis ran out of memory. Throughput usually "
     "rises with the batch and flattens; the star is the winner."),
    ("memory", "Peak memory against batch size",
     "Measured peaks per strategy, the memory limit (red), the usable memory after the headroom "
     "(orange) and the planner's fitted memory line per strategy (dashed: peak = a + m x batch). "
     "Crosses on the limit are probes that ran out of memory. A strategy's largest feasible batch is "
     "where its line crosses the usable memory."),
    ("progress", "Search progress",
     "Each probe's throughput at the probe-seconds spent when it ended (crosses: out of memory or "
     "failed), and the best feasible throughput the search knew after each probe (black steps). A "
     "flat tail means the later probes only confirmed the winner."),
    ("ranking", "Winner and runner-ups",
     "Feasible configs ranked as the search ranks them: median throughput, near-ties (within 2%) "
     "broken toward the lower peak."),
    ("memory_parts", "Where the memory goes",
     "Each config's peak split into parameters, gradients, optimizer state, activations and temporaries "
     "(tensors predicted by the memory estimator, not measured) and, in grey, the rest of the measured peak "
     "(the process or CUDA context, the allocator's caching, workspaces). Activations shrink with "
     "checkpointing or a smaller micro-batch; optimizer state and gradients with sharding."),
)

_STYLE = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; max-width: 980px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
.winner { background: #eef8ee; border: 1px solid #9c9; padding: 0.8em 1em; border-radius: 6px; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.8em 0; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #eee; text-align: right; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
tr.best td { font-weight: bold; background: #eef8ee; } tr.bad td { color: #a33; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
.muted { color: #666; font-size: 0.9em; } dl { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
dt { font-weight: 600; } dd { margin: 0; }
"""


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def render_report(stored: StoredStudy, pngs: dict[str, bytes]) -> str:
    """The HTML page: summary, winner, one section per plot, the runner-ups and all probes."""
    e = html.escape
    frame = stored.trials_frame()
    try:
        document = stored.document()
    except NoFeasibleConfig:
        document = None
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<title>autofit report: {e(stored.name)}</title><style>{_STYLE}</style></head><body>",
             f"<h1>autofit report: {e(stored.name)}</h1>",
             f"<p class=\"muted\">{e(redacted(stored.storage))}</p>", _summary(stored, frame)]
    if document:
        measured = document.measured
        lines = [f"<b>Winner: {e(document.config.label())}</b>, "
                 f"{e(rate_text(measured))}, peak {e(format_size(measured.peak_bytes))} of "
                 f"{e(format_size(stored.memory.usable_bytes))} usable"
                 f" ({e(confirmation_words(measured))})."]
        if measured.flops_per_s:
            lines.append(f"Model FLOPs: {e(work_text(measured.flops_per_s, measured.mfu, measured.joules_per_sample))}.")
        if waited := input_bound_text(measured.data_wait_share):
            lines.append(f"{e(waited.capitalize())}.")
        lines.append(f"Why: {e(document.why)}.")
        parts.append(f"<div class=\"winner\">{'<br>'.join(lines)}</div>")
    else:
        parts.append("<div class=\"winner\"><b>No winner</b>: no probe fits under the usable memory.</div>")
    for stem, title, how in SECTIONS:
        parts.append(f"<h2 id=\"{stem}\">{e(title)}</h2>")
        if stem == "ranking":
            parts.append(_ranking_table(stored))
        parts.append(f"<img alt=\"{e(title)}\" src=\"{data_uri(pngs[stem])}\">")
        parts.append(f"<p class=\"muted\">{e(how)}</p>")
    if document and (forecast := study_forecast(stored)) is not None:
        parts.append(_forecast_table(forecast))
    parts.append("<h2 id=\"probes\">All probes</h2>")
    parts.append(_probes_table(frame, document, stored.ranked_by))
    from autofit._version import __version__

    parts.append(f"<p class=\"muted\">Written by autofit {e(__version__)} on "
                 f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC. Rerun `autofit report` to refresh; "
                 f"`autofit show --trial N` prints one probe's output.</p></body></html>\n")
    return "\n".join(parts)


def _forecast_table(answer: Forecast) -> str:
    """The study's winner forecast for the default GPUs: config, rate and interval, cost per unit."""
    e = html.escape
    unit, amount = answer.unit
    per = "tokens/s" if answer.tokens_per_sample else "samples/s"
    rows = []
    for target in answer.targets:
        c = target.config
        config = f"{c['precision']} b={c['batch_size']} acc={c['accumulation_steps']}" if c else "does not fit"
        rate, cost = answer.units_per_s(target), answer.cost(target, amount)
        rows.append(f"<tr><td class=\"l\">{e(target.gpu.name)}</td><td class=\"l\">{e(config)}</td>"
                    f"<td>{'-' if rate is None else f'{rate[0]:,.0f} ({rate[1]:,.0f}-{rate[2]:,.0f})'}</td>"
                    f"<td>{'-' if cost is None else f'{cost[0]:,.2f} ({cost[1]:,.2f}-{cost[2]:,.2f})'}</td></tr>")
    return (f"<h2 id=\"forecast\">Forecast for other GPUs</h2><table><tr><th class=\"l\">GPU</th>"
            f"<th class=\"l\">config to run</th><th>{e(per)} (interval)</th><th>$ per {e(unit)}</th></tr>"
            + "".join(rows) + f"</table><p class=\"muted\">Scaled from this GPU's measurement by what bounds "
            f"each part (compute by achievable matmul, the rest by bandwidth or not at all); prices on demand, "
            f"{e(PRICES_DATE)}, at the typical price. <code>autofit forecast {e(answer.source.split()[-1])}</code> "
            "says what each figure rests on, and takes --gpu, --price and --tokens.</p>")


def _summary(stored: StoredStudy, frame: pd.DataFrame) -> str:
    e = html.escape
    meta = stored.meta
    counts = frame["status"].value_counts()
    over = int(((frame["status"] == "ok") & ~frame["feasible"].fillna(False)).sum())
    failed = len(frame) - int(counts.get("ok", 0)) - int(counts.get("oom", 0))
    versions = meta.versions
    rows = [
        ("script", f"{meta.script} : {meta.function or 'train'}"),
        ("device", meta.device_name),
        ("memory", f"limit {format_size(stored.memory.limit_bytes)}, usable {format_size(stored.memory.usable_bytes)} "
                   f"({meta.memory.headroom:.0%} headroom)"),
        ("probes", f"{len(frame)}: {int(counts.get('ok', 0))} ran ({over} over the headroom), "
                   f"{int(counts.get('oom', 0))} out of memory, {failed} failed; "
                   f"{format_duration(float(frame['wall_s'].sum()))} of probing"),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items() if v)),
    ]
    return "<dl>" + "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in rows) + "</dl>"


def _ranking_table(stored: StoredStudy) -> str:
    ranked = stored.ranked()
    if not ranked:
        return "<p>No feasible config.</p>"
    head = (f"<table><tr><th>rank</th><th class=\"l\">config</th><th>{stored.ranked_by.unit}</th><th>vs winner</th>"
            "<th>peak</th><th>% of usable</th><th>probes</th></tr>")
    rows = []
    for i, c in enumerate(ranked[:6]):
        peak = c.peak_bytes or 0
        css = ' class="best"' if i == 0 else ""
        rows.append(f"<tr{css}><td>{i + 1}</td>"
                    f"<td class=\"l\">{html.escape(c.config.label())}</td><td>{c.rate:,.1f}</td>"
                    f"<td>{c.rate / ranked[0].rate:.0%}</td><td>{format_size(c.peak_bytes)}</td>"
                    f"<td>{100 * peak / stored.memory.usable_bytes:.0f}%</td><td>{c.probes}</td></tr>")
    return head + "".join(rows) + "</table>"


def _probes_table(frame: pd.DataFrame, document: BestConfig | None, ranked_by: Rate) -> str:
    from autofit.report._plots import config_labels

    e = html.escape
    winner = document.config.label() if document else None
    frame = frame.assign(config=config_labels(frame)).sort_values("trial")
    head = ("<table><tr><th>trial</th><th class=\"l\">phase</th><th class=\"l\">config</th><th class=\"l\">status</th>"
            f"<th>{ranked_by.unit}</th><th>peak</th><th>% of limit</th><th>wall</th><th class=\"l\">error</th></tr>")
    rows, starred = [], False
    for r in frame.itertuples(index=False):
        best = r.config == winner and r.status == "ok" and not starred  # the winner, once, whatever its knobs
        starred = starred or best
        css = ' class="best"' if best else ' class="bad"' if r.status != "ok" or not r.feasible else ""
        value = getattr(r, ranked_by.name)
        rate = "-" if _missing(value) else f"{value:,.1f}"
        peak = "-" if _missing(r.peak_bytes) or r.status == "oom" else format_size(r.peak_bytes)
        share = "-" if _missing(r.peak_fraction) or r.status == "oom" else f"{100 * r.peak_fraction:.0f}%"
        error = "" if _missing(r.error) or r.status == "ok" else str(r.error)[:120]
        rows.append(f"<tr{css}><td>{r.trial}</td><td class=\"l\">{e(r.phase)}</td><td class=\"l\">{e(r.config)}</td>"
                    f"<td class=\"l\">{e(r.status)}</td><td>{rate}</td><td>{e(peak)}</td><td>{share}</td>"
                    f"<td>{format_duration(r.wall_s)}</td><td class=\"l\">{e(error)}</td></tr>")
    return head + "".join(rows) + "</table>"


def _missing(value) -> bool:
    import pandas as pd

    return value is None or bool(pd.isna(value))


def write_report(stored: StoredStudy, path: str, png_dir: str | None = None) -> list[str]:
    """Write the page to `path` (and each plot as PNG_DIR/<stem>.png); returns the PNG paths."""
    from autofit.report._plots import png_bytes, study_figures

    pngs = {stem: png_bytes(fig) for stem, fig in study_figures(stored).items()}
    page = render_report(stored, pngs)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(page)
    written = []
    if png_dir:
        os.makedirs(png_dir, exist_ok=True)
        for stem, data in pngs.items():
            target = os.path.join(png_dir, f"{stem}.png")
            with open(target, "wb") as handle:
                handle.write(data)
            written.append(target)
    return written
