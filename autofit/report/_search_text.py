"""The text summary a search prints: the winner, runner-ups, counts, and why the winner won."""

from __future__ import annotations

from autofit.config import TOKENS
from autofit.probing import input_bound_text
from autofit.report._probe_text import rate_text
from autofit.units import format_duration, format_size


def describe_search(result) -> str:
    lines = []
    state = "interrupted: partial result" if result.partial else f"stopped: {result.stopped}"
    lines.append(f"study {result.study_name}: {result.probes} probes, {result.ooms} did not fit (OOM or over the headroom), "
                 f"{result.failed} failed, {format_duration(result.elapsed_s)} ({state})")
    if result.best is None:
        lines.append("no config fits yet; run the same command to continue")
        return "\n".join(lines)
    lines.append("")
    lines.append(f"{'':2}{'config':<28}{result.best.ranked_by.unit:>12}{'peak':>12}{'probes':>8}")
    for i, c in enumerate(result.ranked[:5]):
        mark = "* " if i == 0 else "  "
        lines.append(f"{mark}{c.config.label():<28}{c.rate:>12,.1f}{format_size(c.peak_bytes):>12}{c.probes:>8}")
    measured = result.document.measured if result.document else None
    if result.best.ranked_by == TOKENS and measured:  # ranked by real tokens/s: say so, and the samples/s
        lines.append(f"{'':2}batches by tokens, ranked by real tokens/s: {result.best.label()} trains {rate_text(measured)}")
    lines.append("")
    waited = input_bound_text(measured.data_wait_share if measured else None)
    if waited:
        lines.append(waited)
    lines.append(f"why: {result.why}")
    for note in result.notes:
        lines.append(f"note: {note}")
    if result.json_path:
        lines.append(f"best config written to {result.json_path}")
    return "\n".join(lines)
