"""Human-readable text for one probe result (the `autofit probe` output)."""

from __future__ import annotations

from autofit.config import TOKENS
from autofit.export import MeasuredFigures
from autofit.probing import ProbeResult, input_bound_text
from autofit.units import format_flops, format_size


def describe_probe(result: ProbeResult, header: str | None = None) -> str:
    rows: list[tuple[str, str]] = [("status", result.status), ("config", result.config.label())]
    if result.samples_per_s is not None:
        rate = f"{result.samples_per_s:,.1f} samples/s"
        if result.tokens_per_s:  # by tokens the rate a search ranks by, first
            tokens = f"{result.tokens_per_s:,.0f} real tokens/s"
            rate = f"{tokens} ({rate})" if result.config.ranked_by == TOKENS else f"{rate}, {tokens}"
        rows.append(("throughput", rate))
    if result.step_time_median_s is not None:
        rows.append((
            "step time",
            f"{result.step_time_median_s:.4f} s median (IQR {result.step_time_iqr_s or 0:.4f} s) "
            f"over {result.measured_steps} steps after {result.warmup_steps} warm-up",
        ))
    if result.probe_accumulation is not None:
        inner = f" (one inside a step: {result.inner_micro_s:.4f} s)" if result.inner_micro_s else ""
        rows.append(("priced", f"a step of {result.config.accumulation_steps} micro-batches, from steps of "
                               f"{result.probe_accumulation} ({result.probe_step_s or 0:.4f} s){inner}"))
    if result.start_s is not None:
        rows.append(("start", f"{result.start_s:.1f} s before the first micro-batch ended (set-up, the script's own "
                              f"evaluation, compilation; not in the throughput)"))
    if result.data_wait_s is not None and result.data_wait_share is not None:
        bound = input_bound_text(result.data_wait_share)
        rows.append(("data wait", f"{result.data_wait_s:.4f} s, {result.data_wait_share:.0%} of the measured time"
                     + (f" ({bound})" if bound else "")))
    if result.peak_bytes is not None:
        peak = format_size(result.peak_bytes)
        if result.memory_limit:
            peak += f" of {format_size(result.memory_limit)} ({100 * result.peak_bytes / result.memory_limit:.0f}%)"
        rows.append(("peak memory", peak))
    if result.flops_per_s is not None or result.flops_per_sample is not None:
        rows.append(("model FLOPs", work_text(result.flops_per_s, result.mfu, result.joules_per_sample,
                                              result.flops_per_sample)))
    if result.compile_s is not None:
        cached = f", {result.compile_cache_hits} graphs from the compiler's cache" if result.compile_cache_hits else ""
        rows.append(("compile", f"{result.compile_s:.1f} s (torch.compile{cached}; not in the throughput)"))
    used = [name for name in ("autocast", "backward", "batches", "compile", "loader") if result.knobs.get(name)]
    if result.knobs.get("checkpoint_blocks") is not None:
        used.append(f"checkpoint ({result.knobs['checkpoint_blocks']} blocks)")
    if result.knobs.get("shard_blocks"):
        used.append(f"sharding ({result.knobs['shard_blocks']} blocks)")
    if result.knobs:
        rows.append(("knobs used", ", ".join(used) or "none"))
    rows.append(("wall time", f"{result.wall_s:.2f} s"))
    if result.error_message:
        rows.append(("error", f"{result.error_type}: {result.error_message.splitlines()[0]}"))
    for note in result.notes:
        rows.append(("note", note))
    if result.log_path:
        rows.append(("output", result.log_path))
    lines = [header] if header else []
    lines += [f"{key:<12} {value}" for key, value in rows]
    if result.traceback and result.status in ("error", "crashed", "timeout"):
        lines += ["", result.traceback.rstrip()]
    if result.status == "oom":
        lines.append("hint         a smaller batch, bf16/fp16, or more checkpointed blocks would fit")
    return "\n".join(lines)


def work_text(flops_per_s: float | None, mfu: float | None, joules_per_sample: float | None,
              flops_per_sample: float | None = None) -> str:
    """'12.3 TFLOP/s, MFU 31.2% of the dense peak, 0.41 J/sample': how hard the device worked."""
    parts = [format_flops(flops_per_s)] if flops_per_s else []
    if flops_per_sample:
        parts.append(f"{flops_per_sample / 1e9:,.2f} GFLOP per sample")
    parts.append(f"MFU {mfu:.1%} of the dense peak" if mfu is not None else "MFU n/a (no known peak for this device)")
    if joules_per_sample is not None:
        parts.append(f"{joules_per_sample:.3g} J/sample")
    return ", ".join(parts)


def rate_text(measured: MeasuredFigures) -> str:
    """The headline rate of a best-config file's `measured`, the one the search ranked by first:
    '265.6 samples/s', or by tokens '51,234 real (non-padding) tokens/s (201.3 samples/s)'."""
    if measured.ranked_by != TOKENS:
        return f"{measured.samples_per_s:,.1f} samples/s"
    samples = f" ({measured.samples_per_s:,.1f} samples/s)" if measured.samples_per_s else ""
    return f"{measured.tokens_per_s:,.0f} real (non-padding) tokens/s{samples}"


def confirmation_words(measured: MeasuredFigures) -> str:
    """How the file's winner was confirmed, in a few words: by its A/B (with how many entrants and their
    widest spread), by one longer run, or not, and why not."""
    if not measured.confirmed:
        return f"unconfirmed: {measured.unconfirmed or 'no longer run measured it'}"
    entrants = measured.ab.entrants if measured.ab else ()
    if len(entrants) > 1:
        return f"confirmed by an A/B of {len(entrants)} configs, spread {100 * (measured.ab.spread or 0):.1f}%"
    return "confirmed by a longer run"
