"""The most any token cap can give over the safe fixed batch on this CPU, without autofit: whole epochs of the
token benchmark's data (benchmarks/tokens_study.py: 2048 ShareGPT-like conversations, TinyLM width 128) in a
plain loop, batched by a token cap (autofit.runtime.TokenBatchSampler, sorted and cut, no probe order) at each
of several caps and padded multiples, and by the safe fixed batch (90 shuffled samples padded to their longest),
interleaved over rounds, one process each, the per-shape caches bounded as every CPU run of autofit bounds them.

    python -m benchmarks.token_ceiling [--precision bf16] [--rounds 3]

Real (non-padding) tokens/s over each epoch after its first 3 steps, and each cap's ÷ the fixed batch in the same
round. Where no cap reaches a ratio, no search can: the issue's floor is then the CPU's, not the batcher's.
Writes benchmarks/token-ceiling-cpu-PRECISION.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks import REPO, publish, pythonpath

HERE = os.path.dirname(os.path.abspath(__file__))
FIXED = 90  # the safe fixed batch benchmarks.tokens found in bf16 under 1 GiB (2026-12-05)
STRATEGIES = ("fixed:90:1", "tokens:4096:1", "tokens:6144:1", "tokens:8192:1", "tokens:12288:1", "tokens:6144:8")
SKIPPED = 3  # steps before the clock starts: the first shapes' one-time costs


def epoch(strategy: str, precision: str) -> dict:
    """One epoch of `strategy` ("fixed:SAMPLES:1" or "tokens:CAP:MULTIPLE") in this process."""
    import torch

    from autofit.runtime import TokenBatchSampler
    from benchmarks.padded_rate import train_step
    from tests.corpus.sft_tokens import IGNORE, PAD, Conversations, TinyLM, collate, sharegpt_like_lengths

    kind, size, multiple = strategy.split(":")
    lengths = sharegpt_like_lengths(2048, scale=8)
    data = Conversations(lengths)
    pad = functools.partial(_padded, collate=collate, multiple=int(multiple), pad=PAD, ignore=IGNORE)
    if kind == "fixed":
        loader = torch.utils.data.DataLoader(data, batch_size=int(size), shuffle=True, collate_fn=pad,
                                             generator=torch.Generator().manual_seed(0))
    else:
        sampler = TokenBatchSampler(lengths, int(size), seed=0, pad_multiple=int(multiple))
        loader = torch.utils.data.DataLoader(data, batch_sampler=sampler, collate_fn=pad)
    torch.manual_seed(0)
    model = TinyLM(width=128, context=max(lengths))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    real = padded = steps = 0
    started = None
    for x, y in loader:
        if steps == SKIPPED:
            started, real, padded = time.perf_counter(), 0, 0
        train_step(model, optimizer, x, y, precision)
        real, padded, steps = real + int((x != PAD).sum()), padded + x.numel(), steps + 1
    seconds = time.perf_counter() - started
    return {"real_per_s": real / seconds, "padding": 1 - real / padded, "steps": steps}


def _padded(items, *, collate, multiple: int, pad: int, ignore: int):
    """The benchmark's collate, its length rounded up to `multiple`."""
    from torch.nn import functional as F

    x, y = collate(items)
    extra = -x.shape[1] % multiple
    return (F.pad(x, (0, extra), value=pad), F.pad(y, (0, extra), value=ignore)) if extra else (x, y)


def _in_process(strategy: str, precision: str) -> dict:
    """One epoch in a fresh process, the caches bounded as autofit bounds them in every CPU run."""
    from autofit.runtime import DEFAULT_CAPACITIES

    bounds = {name: str(value) for name, value in DEFAULT_CAPACITIES.items()}
    env = {**os.environ, **bounds, "PYTHONPATH": pythonpath()}
    command = [sys.executable, "-m", "benchmarks.token_ceiling", "--one", strategy, "--precision", precision]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # one epoch of one strategy, in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(epoch(args.one, args.precision)))
        return
    began = time.perf_counter()
    rounds = [{strategy: _in_process(strategy, args.precision) for strategy in STRATEGIES} for _ in range(args.rounds)]
    fixed = STRATEGIES[0]
    minutes = (time.perf_counter() - began) / 60
    lines = [f"`python -m benchmarks.token_ceiling --precision {args.precision} --rounds {args.rounds}` "
             f"({minutes:.1f} min, {os.cpu_count()} cores, a plain loop: no autofit in it)", "",
             "| batching | real tokens/s (median) | ÷ the safe fixed batch (median, range) | padding | steps |",
             "|---|---:|---|---:|---:|"]
    for strategy in STRATEGIES:
        kind, size, multiple = strategy.split(":")
        name = (f"fixed, {size} samples" if kind == "fixed"
                else f"max_tokens={size}" + (f", padded to a multiple of {multiple}" if multiple != "1" else ""))
        rates = [r[strategy]["real_per_s"] for r in rounds]
        ratios = [r[strategy]["real_per_s"] / r[fixed]["real_per_s"] for r in rounds]
        lines.append(f"| {name} | {statistics.median(rates):,.0f} | {statistics.median(ratios):.2f}x "
                     f"({min(ratios):.2f}-{max(ratios):.2f}) | {rounds[0][strategy]['padding']:.1%} | "
                     f"{rounds[0][strategy]['steps']} |")
    publish("\n".join(lines) + "\n", os.path.join(HERE, f"token-ceiling-cpu-{args.precision}.md"))


if __name__ == "__main__":
    main()
