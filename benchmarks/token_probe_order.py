"""How far a token probe's few measured steps read from the whole epoch's real tokens/s: its batches
shuffled (the order before) against stratified by length (autofit.runtime._probe_order).

    python -m benchmarks.token_probe_order [--caps 2048,4096,8192] [--seeds 200] [--passes 2]

The model and data are benchmarks/tokens_study.py's at TOKENS_SCALE=2 with eager attention (lengths
16..1024, a long tail; scores kept for backward, so a token costs more in a longer sequence). For each
token cap, every batch of one epoch is timed for real (forward, backward, AdamW step; the median of
`--passes` passes, after a warm-up), which gives the epoch's real tokens/s. Then, over `--seeds` orders of
each kind, the probe's measured window is read from those times: its first step is the worst batch, then
one more warm-up step, then 5 measured steps (a probe) or 10 (a remeasured contender). The error is the
window's real tokens/s against the epoch's. Sampling error only: both orders read the same timed batches.
Writes benchmarks/token-probe-order.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TOKENS_SCALE", "2")
os.environ.setdefault("TOKENS_ATTENTION", "eager")

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from autofit.runtime import TokenBatchSampler  # noqa: E402
from autofit.runtime._probe_order import stratified  # noqa: E402
from benchmarks import tokens_study as study  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WINDOWS = {"probe (5 steps)": 5, "remeasured (10 steps)": 10}


def time_batches(batches: list[list[int]], passes: int) -> list[float]:
    """Seconds of one training step on each batch, the median over `passes` passes."""
    torch.manual_seed(0)
    model = study.build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    def step(batch: list[int]) -> float:
        x, y = study.collate([study.DATA[i] for i in batch])
        started = time.perf_counter()
        logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, study.VOCAB), y.reshape(-1), ignore_index=study.IGNORE)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    for batch in batches[:3]:  # warm-up: allocator and kernels
        step(batch)
    timings = [[step(batch) for batch in batches] for _ in range(passes)]
    return [statistics.median(seconds) for seconds in zip(*timings, strict=True)]


def window_errors(batches: list[list[int]], seconds: list[float], epoch_rate: float, steps: int, seeds: int,
                  order: str) -> list[float]:
    """The window's tokens/s over the epoch's, minus one, for each seed's order of the one epoch's timed
    batches: the worst batch first, then the rest shuffled (the probe's order before) or stratified."""
    worst, rest = 0, list(range(1, len(batches)))  # the cut puts the longest samples' batch first
    errors = []
    for seed in range(seeds):
        generator = torch.Generator().manual_seed(seed)
        if order == "shuffled":
            ordered = [rest[i] for i in torch.randperm(len(rest), generator=generator).tolist()]
        else:
            ordered = stratified(rest, lambda i: (study.LENGTHS[batches[i][0]], len(batches[i])), 1, generator)
        window = ([worst] + ordered)[2:2 + steps]
        tokens = sum(study.LENGTHS[i] for b in window for i in batches[b])
        errors.append(tokens / sum(seconds[b] for b in window) / epoch_rate - 1)
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--caps", default="2048,4096,8192")
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(HERE, "token-probe-order.md"))
    args = parser.parse_args()
    rows = []
    for cap in (int(c) for c in args.caps.split(",")):
        batches = TokenBatchSampler(study.LENGTHS, cap, shuffle=False).all_batches()  # one epoch's, longest first
        seconds = time_batches(batches, args.passes)
        epoch_rate = sum(study.LENGTHS) / sum(seconds)
        for name, steps in WINDOWS.items():
            for order in ("shuffled", "stratified"):
                errors = [abs(e) for e in window_errors(batches, seconds, epoch_rate, steps, args.seeds, order)]
                rows.append((cap, len(batches), epoch_rate, name, order, statistics.mean(errors),
                             statistics.quantiles(errors, n=10)[-1], max(errors)))
                print(f"max_tokens={cap} {name} {order}: mean {rows[-1][5]:.1%} p90 {rows[-1][6]:.1%} "
                      f"max {rows[-1][7]:.1%}", flush=True)
    lines = [
        "# A token probe's measured window against the whole epoch",
        "",
        f"`python -m benchmarks.token_probe_order --caps {args.caps} --seeds {args.seeds} --passes {args.passes}` "
        f"(torch {torch.__version__}, {torch.get_num_threads()} threads). Model and data: "
        f"benchmarks/tokens_study.py, TOKENS_SCALE={os.environ['TOKENS_SCALE']}, "
        f"TOKENS_ATTENTION={os.environ['TOKENS_ATTENTION']}, {len(study.LENGTHS)} samples of "
        f"{min(study.LENGTHS)}..{max(study.LENGTHS)} tokens. Every batch of an epoch timed for real; each "
        f"window's real tokens/s against the epoch's, over {args.seeds} orders: |error|, mean, 90th "
        "percentile and largest.",
        "",
        "| max_tokens | batches | epoch real tokens/s | window | order | mean | p90 | max |",
        "|---:|---:|---:|---|---|---:|---:|---:|",
    ]
    lines += [f"| {cap} | {count} | {rate:,.0f} | {name} | {order} | {mean:.1%} | {p90:.1%} | {worst:.1%} |"
              for cap, count, rate, name, order, mean, p90, worst in rows]
    with open(args.out, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
