"""How a CPU's early training steps compare with its steady state, without autofit: `studies/gpt.py`'s model and
data as a plain loop, its per-step wall times.

    python -m benchmarks.early_steps [--batch-size 96] [--steps 36]

Why: a probe measures a few steps after two warm-up steps; on a CPU those read slower than a long run's steady
state (issue 37, item 9). This prints samples/s over steps 3-7 (a probe's window) and over steps 10 to the end,
and their ratio, for the same process.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch
from torch.utils.data import DataLoader, RandomSampler

import studies.gpt as gpt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=96)
    parser.add_argument("--steps", type=int, default=36)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = gpt.GPT(len(gpt.VOCAB), gpt.SEQ_LEN, gpt.D_MODEL, gpt.N_LAYERS, gpt.N_HEADS, gpt.DROPOUT)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    loader = DataLoader(gpt.DATASET, batch_size=args.batch_size, sampler=RandomSampler(gpt.DATASET), drop_last=True)
    batches = itertools.chain.from_iterable(itertools.repeat(loader))
    times, last = [], time.perf_counter()
    for _ in range(args.steps):
        x, y = next(batches)
        model(x, y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        now = time.perf_counter()
        times.append(now - last)
        last = now
    early, steady = args.batch_size / statistics.mean(times[2:7]), args.batch_size / statistics.mean(times[9:])
    print(f"threads {torch.get_num_threads()}: steps 3-7 {early:.1f} samples/s, steps 10-{args.steps} "
          f"{steady:.1f} samples/s, ratio {early / steady:.3f}")


if __name__ == "__main__":
    main()
