"""How far `autofit forecast` is from what was measured, beside the naive single ratios.

    python -m benchmarks.forecast                       # the tables in docs/benchmarks.md
    python -m benchmarks.forecast --held-out FILE [--target H100] [--measured-tokens 487000]

No GPU is needed: it forecasts from files and published figures, and times nothing.

Throughput pairs (a measured rate on one GPU forecast for another, against what that other measured):
every pair whose two GPUs measured the same program. The repository's own GPU logs are all from one H100,
so its pairs are public: llm.c's GPT-2 124M, about 231k tokens/s on an A100 and 468k on an H100
(autofit's sixth survey of public figures, docs/guide/forecast.md), each way. Its FLOPs per token are autofit's count of the same
GPT-2 small at 1024 tokens (benchmarks/gpu/results/2026-11-25-gpt124m.best.json). Beside each forecast,
the errors of scaling by one ratio: the dense bf16 peak, the achievable matmul (MAMF), the HBM bandwidth.

Memory (a forecast micro-batch against the peaks measured on the GPU): the H100 logs' probes give each
strategy's peak at several micro-batches; a forecast for a smaller GPU is checked against the measured
(or, between two measured micro-batches, interpolated) peak at the micro-batch it picked: would it have
run out of memory (over the GPU's total less the CUDA context), and did it keep the headroom.

--held-out FILE: the issue's held-out check: a best-config file of nanoGPT's train.py at its defaults
measured on another GPU (an H200: `benchmarks/gpu/run_checklist.sh forecast`), forecast for an H100,
against what the repository measured there on 2026-11-27 (bf16 b=60 acc=8, 475.7 samples/s, 487k
tokens/s, peak 67.14 GiB of 79.65 GiB).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys

from autofit.errors import AutofitError
from autofit.forecast import CONTEXT_BYTES, HELD_OUT, forecast, forecast_input, gpu_spec, naive_ratios
from autofit.units import format_size

RESULTS = os.path.join(os.path.dirname(__file__), "gpu", "results")
GIB = 1024**3
#: autofit's FLOPs of GPT-2 small (124M) per 1024-token sample (its H100 best-config file, 2026-11-25).
GPT2_FLOPS_PER_SAMPLE = 894272274432.0
#: NVML names and totals of the GPUs the pairs ran on.
DEVICES = {"A100-80GB": ("NVIDIA A100-SXM4-80GB", 81920 * 1024**2), "H100": ("NVIDIA H100 80GB HBM3", 85520809984),
           "H200": ("NVIDIA H200", 143771 * 1024**2)}
#: (program, GPU, tokens/s, source): public figures of one program on two GPUs.
PUBLIC = [("llm.c GPT-2 124M", "A100-80GB", 231e3, "llm.c, autofit's sixth survey"),
          ("llm.c GPT-2 124M", "H100", 468e3, "llm.c, autofit's sixth survey")]
#: The 2026-11-27 H100 measurement of nanoGPT's train.py at its defaults (its log in RESULTS).
NANOGPT_H100 = {"samples_per_s": 475.7, "tokens_per_s": 475.7 * 1024, "batch_size": 60, "peak_gib": 67.14}


def document(gpu: str, samples_per_s: float, tokens_per_sample: int, flops_per_sample: float | None,
             config: dict, runner_ups: list[dict] | None = None, peak_bytes: float | None = None) -> dict:
    """A best-config document as a search on `gpu` would have written it, from published figures."""
    name, total = DEVICES[gpu]
    measured = {"samples_per_s": samples_per_s, "tokens_per_s": samples_per_s * tokens_per_sample,
                "peak_bytes": peak_bytes, "flops_per_sample": flops_per_sample}
    return {"config": config, "measured": measured, "runner_ups": runner_ups or [],
            "memory": {"limit_bytes": total, "headroom": 0.1, "usable_bytes": total * 0.9},
            "device": {"type": "cuda", "name": name, "total_bytes": total}}


def throughput_rows(pairs=HELD_OUT) -> list[dict]:
    """Each measured pair: the public one both ways (the pair the model was shaped on), then each held-out pair
    the repository keeps the log of (`autofit.forecast.HELD_OUT`): the forecast (point and interval), its
    error, the naive ratios' errors. Never a forecast nothing measured."""
    rows = _public_rows()
    for pair in pairs:  # the pair's log has both figures; the naive ratios are the public pair's comparison
        rows.append({"program": pair.program, "pair": f"{pair.source} -> {pair.target}", "held_out": True,
                     "measured_source": None, "measured_target": pair.measured, "forecast": pair.forecast,
                     "low": None, "high": None, "error": pair.error, "log": pair.log,
                     **{f"{k}_error": None for k in ("peak", "matmul", "bandwidth")}})
    return rows


def _public_rows() -> list[dict]:
    """The public pair both ways (llm.c's GPT-2 124M, A100 and H100): what the model was shaped on."""
    rows = []
    for program, source, rate, _ in PUBLIC:
        for other, target, truth, _ in PUBLIC:
            if other != program or target == source:
                continue
            doc = document(source, rate / 1024, 1024, GPT2_FLOPS_PER_SAMPLE,
                           {"batch_size": 64, "accumulation_steps": 8, "global_batch": 512, "precision": "bf16"},
                           peak_bytes=None)
            answer = forecast(doc, [gpu_spec(target)]).targets[0]
            point, low, high = answer.chosen.rate.scaled(1024) if answer.chosen else (None,) * 3
            naive = naive_ratios(gpu_spec(source), gpu_spec(target))
            rows.append({"program": program, "pair": f"{source} -> {target}", "held_out": False,
                         "measured_source": rate,
                         "measured_target": truth, "forecast": point, "low": low, "high": high,
                         "error": point / truth - 1,
                         **{f"{k}_error": rate * v / truth - 1 for k, v in naive.items()}})
    return rows


def log_peaks(path: str) -> dict[tuple[str, int], float]:
    """(precision, micro-batch) to the largest peak the probes of a search log measured (no checkpointing)."""
    pattern = re.compile(r"trial \d+: ok\s+(\w+) b=(\d+)(?: acc=\d+)?\s+[\d.]+ samples/s\s+peak ([\d.]+) GiB")
    peaks: dict[tuple[str, int], float] = {}
    for match in pattern.finditer(open(path, encoding="utf-8").read()):
        key = (match.group(1), int(match.group(2)))
        peaks[key] = max(peaks.get(key, 0.0), float(match.group(3)) * GIB)
    return peaks


def measured_peak(peaks: dict[tuple[str, int], float], precision: str, batch: int) -> tuple[float | None, str]:
    """The measured peak at `batch`, or interpolated between the two measured micro-batches around it."""
    sizes = sorted(b for p, b in peaks if p == precision)
    if batch in sizes:
        return peaks[(precision, batch)], "measured"
    below, above = [b for b in sizes if b < batch], [b for b in sizes if b > batch]
    if not below or not above:
        return None, "beyond the measured micro-batches"
    a, b = below[-1], above[0]
    pa, pb = peaks[(precision, a)], peaks[(precision, b)]
    return pa + (pb - pa) * (batch - a) / (b - a), f"interpolated ({a}..{b})"


def nanogpt_document() -> dict:
    """The 2026-11-27 H100 search of nanoGPT's defaults as its best-config file held it (from its log)."""
    peaks = log_peaks(os.path.join(RESULTS, "2026-11-27-nanogpt-defaults.log"))
    flops = 425.5e12 / 475.7  # its log: 425.5 TFLOP/s at 475.7 samples/s
    runner = {"batch_size": 32, "accumulation_steps": 15, "global_batch": 480, "precision": "bf16",
              "samples_per_s": 465.0, "peak_bytes": peaks[("bf16", 32)]}
    return document("H100", 475.7, 1024, flops,
                    {"batch_size": 60, "accumulation_steps": 8, "global_batch": 480, "precision": "bf16"},
                    [runner], peaks[("bf16", 60)])


def memory_rows() -> list[dict]:
    """Forecasts from the H100 files for every listed GPU, against the H100's measured peaks."""
    cases = [("GPT-2 small (gpt124m.py)", json.load(open(os.path.join(RESULTS, "2026-11-25-gpt124m.best.json"))),
              log_peaks(os.path.join(RESULTS, "2026-11-25-gpt124m-search-compare.log"))),
             ("nanoGPT train.py defaults", nanogpt_document(),
              log_peaks(os.path.join(RESULTS, "2026-11-27-nanogpt-defaults.log")))]
    rows = []
    for program, doc, peaks in cases:
        for gpu in ("H100", "A100-40GB", "L40S", "L4", "A10G", "T4", "V100"):
            target = forecast(doc, [gpu_spec(gpu)]).targets[0]
            chosen = target.chosen
            batch = chosen.batch_size if chosen else 0
            peak, how = measured_peak(peaks, "bf16", batch) if chosen else (None, "-")
            capacity = target.gpu.memory_bytes - CONTEXT_BYTES
            rows.append({"program": program, "gpu": gpu, "config": target.config, "batch": batch,
                         "forecast_peak": chosen.peak_bytes if chosen else None, "measured_peak": peak, "how": how,
                         "capacity": capacity, "usable": target.usable_bytes,
                         "oom": peak is not None and peak > capacity,
                         "headroom_kept": peak is None or peak <= target.usable_bytes})
    return rows


def _pct(value: float) -> str:
    return f"{value:+.0%}"


def _cell(value: float | None, text) -> str:
    return "-" if value is None else text(value)


def markdown(throughput: list[dict], memory: list[dict]) -> str:
    lines = ["| program | pair | held out | measured on the source | forecast (interval) | measured on the target "
             "| error | peak ratio | MAMF ratio | bandwidth ratio |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in throughput:
        interval = "" if r["low"] is None else f" ({r['low'] / 1e3:.0f}k-{r['high'] / 1e3:.0f}k)"
        lines.append(f"| {r['program']} | {r['pair']} | {'yes' if r['held_out'] else 'no: it shaped the model'} "
                     f"| {_cell(r['measured_source'], lambda v: f'{v / 1e3:.0f}k tok/s')} "
                     f"| {r['forecast'] / 1e3:.0f}k{interval} | {r['measured_target'] / 1e3:.0f}k | {_pct(r['error'])} "
                     f"| {_cell(r['peak_error'], _pct)} | {_cell(r['matmul_error'], _pct)} "
                     f"| {_cell(r['bandwidth_error'], _pct)} |")
    median = statistics.median(abs(r["error"]) for r in throughput)
    inside = sum(r["low"] is not None and r["low"] <= r["measured_target"] <= r["high"] for r in throughput)
    held = [r for r in throughput if r["held_out"]]
    lines += ["", f"Median throughput error {median:.1%} over {len(throughput)} measured pairs ({len(held)} held out); "
              f"the measured figure inside the interval in {inside} of {len(throughput)}.", "",
              "| program | target | forecast config | forecast peak | peak measured on the H100 at that micro-batch "
              "| target total less context | out of memory | headroom kept |", "|---|---|---|---|---|---|---|---|"]
    for r in memory:
        c = r["config"]
        config = f"{c['precision']} b={c['batch_size']} acc={c['accumulation_steps']}" if c else "does not fit"
        peak = "-" if r["measured_peak"] is None else f"{format_size(r['measured_peak'])} ({r['how']})"
        lines.append(f"| {r['program']} | {r['gpu']} | {config} | {format_size(r['forecast_peak'])} | {peak} "
                     f"| {format_size(r['capacity'])} | {'yes' if r['oom'] else 'no'} "
                     f"| {'yes' if r['headroom_kept'] else 'no'} |")
    ooms = sum(r["oom"] for r in memory)
    checked = sum(r["measured_peak"] is not None for r in memory)
    lines += ["", f"Memory forecasts that would have run out of memory: {ooms} of the {checked} the logs can "
              f"check ({len(memory)} forecast)."]
    return "\n".join(lines)


def held_out(path: str, target: str = "H100", measured_samples: float = NANOGPT_H100["samples_per_s"],
             measured_tokens: float | None = NANOGPT_H100["tokens_per_s"],
             tokens_per_sample: float | None = None) -> dict:
    """The held-out check: FILE (measured on another GPU) forecast for `target`, against what `target` measured
    (by default the 2026-11-27 H100 figures of nanoGPT's defaults). Any best-config file autofit writes: the
    error is in samples/s, which every file records (nanoGPT's own loop counts no tokens: its files hold
    "tokens_per_s": null); tokens/s and the cost per billion tokens where the file counts tokens or
    `tokens_per_sample` says how many a sample holds, else the cost per million samples."""
    answer = forecast(forecast_input(path), [gpu_spec(target)], tokens_per_sample=tokens_per_sample)
    t = answer.targets[0]
    rate = t.chosen.rate if t.chosen else None
    point, low, high = rate.scaled(1.0) if rate else (None, None, None)
    tokens = answer.units_per_s(t) if answer.tokens_per_sample else None
    unit, amount = answer.unit
    result = {"file": path, "device": answer.device, "target": target, "config": t.config,
              "peak_bytes": t.chosen.peak_bytes if t.chosen else None, "usable_bytes": t.usable_bytes,
              "samples_per_s": point, "interval": [low, high], "measured_samples_per_s": measured_samples,
              "error": None if point is None else point / measured_samples - 1,
              "tokens_per_s": tokens[0] if tokens else None, "measured_tokens_per_s": measured_tokens,
              "tokens_error": tokens[0] / measured_tokens - 1 if tokens and measured_tokens else None,
              "cost_unit": unit, "cost": answer.cost(t, amount), "notes": answer.notes + t.notes}
    result["passes"] = bool(t.chosen and t.chosen.peak_bytes is not None and t.chosen.peak_bytes <= t.usable_bytes
                            and result["error"] is not None and abs(result["error"]) <= 0.10 and result["cost"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held-out", default=None, help="A best-config file measured on another GPU.")
    parser.add_argument("--target", default="H100")
    parser.add_argument("--measured-samples", type=float, default=NANOGPT_H100["samples_per_s"],
                        help="samples/s the target measured (default: nanoGPT's defaults on the H100, 2026-11-27)")
    parser.add_argument("--measured-tokens", type=float, default=NANOGPT_H100["tokens_per_s"])
    parser.add_argument("--tokens-per-sample", type=float, default=None,
                        help="the tokens a sample holds, for a file that counts samples only (nanoGPT's: 1024)")
    args = parser.parse_args()
    if args.held_out:
        try:
            answer = held_out(args.held_out, args.target, args.measured_samples, args.measured_tokens,
                              args.tokens_per_sample)
        except AutofitError as error:
            sys.exit(f"benchmarks.forecast: error: {error}")
        print(json.dumps(answer, indent=2, allow_nan=False))
        return
    print(markdown(throughput_rows(), memory_rows()))


if __name__ == "__main__":
    main()
