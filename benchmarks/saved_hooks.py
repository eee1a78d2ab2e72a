"""Does a probe run the code its normal run runs? A host-bound step under a probe's Run and a normal run's, in one
process, interleaved.

    python -m benchmarks.saved_hooks [--rounds 15] [--steps 200] [--batch-size 8 32]

A normal run that recovers from OOMs saves every tensor its forward under `run.autocast()` saves for backward
through Python hooks (autofit/runtime/_saved.py: the redo lets the failed step's activations go), a Python call
per saved tensor. A probe built as before issue 52 ran without them (`holds_saved=False`); a probe now runs them
wherever its normal run will. Round after round, the same model (benchmarks/fidelity_scripts/host_bound.py: 24
blocks of Linear 64, LayerNorm, GELU) takes `--steps` steps under each of the three Runs, in turn, through
`run.batches`, `run.autocast()` and `run.backward()`; each figure is the median over rounds of its steps' time,
and each ratio the median of the rounds' own ratios, so a drift of a shared machine hits all three alike.
Writes a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import sys
import time

import torch

from autofit.config import Config
from autofit.runtime import ProbeFinished, Run

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fidelity_scripts"))

from host_bound import WIDTH, build  # noqa: E402

KINDS = ("probe without hooks (before)", "probe with hooks (now)", "normal run")


def _run(kind: str, batch: int, steps: int) -> Run:
    config = Config(batch_size=batch)
    if kind == "normal run":
        return Run(config, "cpu", recover_oom=True)
    return Run(config, "cpu", probing=True, warmup_steps=0, measured_steps=steps, max_measured_steps=steps,
               holds_saved=kind == KINDS[1])


def timed(kind: str, batch: int, steps: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
    """Seconds a step of `steps` under `kind`'s Run."""
    run = _run(kind, batch, steps)
    batches = itertools.repeat(torch.randn(batch, WIDTH), steps)
    started = time.perf_counter()
    try:
        with run.control.active():
            for x in run.batches(batches):
                with run.autocast():
                    loss = model(x).square().mean()
                run.backward(loss, optimizer)
        run.finish()
    except ProbeFinished:
        pass
    return (time.perf_counter() - started) / steps


def measure(batch: int, rounds: int, steps: int) -> dict[str, list[float]]:
    torch.manual_seed(0)
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for kind in KINDS:  # first use of every path, off the record
        timed(kind, batch, steps // 4, model, optimizer)
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for round_ in range(rounds):
        order = KINDS if round_ % 2 == 0 else tuple(reversed(KINDS))
        for kind in order:
            times[kind].append(timed(kind, batch, steps, model, optimizer))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[8, 32])
    args = parser.parse_args()
    lines = [f"Host-bound step, {args.rounds} interleaved rounds of {args.steps} steps each, "
             f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores), {torch.get_num_threads()} threads.",
             "", "| micro-batch | " + " | ".join(f"{k} ms/step" for k in KINDS)
             + " | probe ÷ normal run, before (rate) | probe ÷ normal run, now (rate) |",
             "|---|" + "---:|" * (len(KINDS) + 2)]
    for batch in args.batch_size:
        times = measure(batch, args.rounds, args.steps)
        normal = times["normal run"]
        before = statistics.median(n / p for p, n in zip(times[KINDS[0]], normal))  # a rate ratio: time inverted
        now = statistics.median(n / p for p, n in zip(times[KINDS[1]], normal))
        cells = " | ".join(f"{statistics.median(times[k]) * 1e3:.2f}" for k in KINDS)
        lines.append(f"| {batch} | {cells} | {before:.3f} | {now:.3f} |")
        print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
