"""Activation checkpointing policies at one batch: what selective checkpointing saves and costs next
to none and full.

    python -m benchmarks.checkpoint_policy [--study studies/gpt.py] [--batch-size 128] [--memory-limit 2GiB]
                                           [--rounds 5] [--steps 10]

Three configs of the study at one micro-batch, fp32: no checkpointing, every block the function
offers to run.checkpoint() checkpointed fully, and the same selectively (matmul, convolution and
attention outputs kept, the rest recomputed). Measured through autofit's worker under the CPU cap,
interleaved: each round probes all three, in an order rotated from round to round, so a change of
the machine's state falls on all of them alike. Reports each config's median peak and throughput,
and as ratios: the memory above the worker's baseline each keeps (the activations' share), the
share of full checkpointing's saving selective gets, the throughput each keeps, and the share of
full checkpointing's recompute cost selective pays. Writes benchmarks/checkpoint-policy.md
(--out elsewhere).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from autofit.config import Config
from autofit.export import MemoryBudget
from autofit.probing import Worker
from autofit.units import format_size, parse_size

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 2**20


def measure(args) -> tuple[list[Config], dict[Config, list], int]:
    """Every config's probe results, round by round, and the blocks the function offered."""
    with Worker(args.study, budget=MemoryBudget(limit_bytes=args.memory_limit)) as worker:
        worker.start()
        first = worker.probe(Config(batch_size=args.batch_size), warmup=1, steps=1, timeout=600, min_measure_s=0.0)
        if not first.ok:
            sys.exit(f"The study must run at batch {args.batch_size} under {format_size(args.memory_limit)}, "
                     f"but its probe ended {first.status}: {first.error_message}")
        blocks = first.offers.checkpoint_blocks
        if not blocks:
            sys.exit(f"The study must offer blocks to run.checkpoint(), but {args.study} offers none.")
        configs = [Config(batch_size=args.batch_size),
                   Config(batch_size=args.batch_size, checkpoint_segments=blocks),
                   Config(batch_size=args.batch_size, checkpoint_segments=blocks, checkpoint_policy="selective")]
        results: dict[Config, list] = {c: [] for c in configs}
        for r in range(args.rounds):
            for config in configs[r % 3:] + configs[:r % 3]:
                result = worker.probe(config, warmup=args.warmup, steps=args.steps, timeout=600)
                results[config].append(result)
                print(f"round {r + 1}: {config.label():<28} {result.status:<6} "
                      f"{(result.samples_per_s or 0):8.1f} samples/s  peak {(result.peak_bytes or 0) / MiB:7.1f} MiB",
                      file=sys.stderr)
    return configs, results, blocks


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def report(args, configs: list[Config], results: dict[Config, list], blocks: int, minutes: float) -> str:
    ok = {c: [r for r in results[c] if r.ok] for c in configs}
    peak = {c: _median([r.peak_bytes for r in ok[c]]) for c in configs}
    rate = {c: _median([r.samples_per_s for r in ok[c]]) for c in configs}
    baseline = _median([r.baseline_bytes for c in configs for r in ok[c]]) or 0.0
    none, full, selective = configs
    names = {none: "none", full: f"full, {blocks} blocks", selective: f"selective, {blocks} blocks"}
    command = "python -m benchmarks.checkpoint_policy " + " ".join(sys.argv[1:])
    lines = [f"`{command}` ({minutes:.1f} min, {os.cpu_count()} cores; {args.study}, fp32 b={args.batch_size}, "
             f"limit {format_size(args.memory_limit)}; {args.rounds} interleaved rounds of {args.warmup} warm-up "
             f"and {args.steps} measured steps; worker baseline {baseline / MiB:.0f} MiB)", "",
             "| checkpointing | probes ok | peak MiB | above baseline MiB | ÷ none (above baseline) "
             "| samples/s | ÷ none |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for c in configs:
        above = peak[c] - baseline if peak[c] is not None else None
        above_none = peak[none] - baseline if peak[none] is not None else None
        lines.append(f"| {names[c]} | {len(ok[c])}/{len(results[c])} | {_mib(peak[c])} | {_mib(above)} | "
                     f"{_ratio(above, above_none)} | {_num(rate[c])} | {_ratio(rate[c], rate[none])} |")
    saving = _ratio(_minus(peak[none], peak[selective]), _minus(peak[none], peak[full]))
    cost = _ratio(_minus(rate[none], rate[selective]), _minus(rate[none], rate[full]))
    lines += ["", f"Selective checkpointing gets {saving} of full checkpointing's memory saving "
                  f"(peak none − selective ÷ none − full) for {cost} of its recompute cost "
                  f"(throughput none − selective ÷ none − full)."]
    return "\n".join(lines) + "\n"


def _minus(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "n/a"


def _mib(value: float | None) -> str:
    return f"{value / MiB:,.0f}" if value is not None else "n/a"


def _num(value: float | None) -> str:
    return f"{value:,.1f}" if value is not None else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", default="studies/gpt.py")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--memory-limit", type=parse_size, default=parse_size("2GiB"))
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (each probes all three configs)")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per probe")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up steps per probe")
    parser.add_argument("--out", default=os.path.join(HERE, "checkpoint-policy.md"))
    args = parser.parse_args()
    started = time.perf_counter()
    configs, results, blocks = measure(args)
    text = report(args, configs, results, blocks, (time.perf_counter() - started) / 60)
    print(text)
    with open(args.out, "w") as handle:
        handle.write("# Activation checkpointing policies: none, full, selective\n\n" + text)


if __name__ == "__main__":
    main()
