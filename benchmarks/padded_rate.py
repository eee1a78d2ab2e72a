"""How fast the token benchmark's model trains per padded token at each batch shape, bf16 and fp32: what bounds
autofit ÷ the safe fixed batch in `benchmarks.tokens` beside the padding.

    python -m benchmarks.padded_rate [--cap 8192] [--repeats 5]

The model of benchmarks/tokens_study.py (tests/corpus/sft_tokens.py's TinyLM, width 128); a step (forward, loss,
backward, AdamW) of a batch of `cap // length` samples at each length, each shape met once before it is timed
(the median of `repeats`), then the safe fixed batch of the benchmark (90 samples of 256). Where a precision runs
the fixed batch as fast per padded token as the token batches, the ratio of real tokens/s is the padding's:
(1 - the token batches' padding) / (1 - the fixed batch's). Writes benchmarks/padded-rate-cpu.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.nn import functional as F

from benchmarks import publish
from tests.corpus.sft_tokens import VOCAB, TinyLM

HERE = os.path.dirname(os.path.abspath(__file__))
LENGTHS = (8, 16, 32, 64, 128, 256)
FIXED = (90, 256)  # the safe fixed batch benchmarks.tokens found in bf16 under 1 GiB (2026-12-05)


def padded_rate(precision: str, samples: int, length: int, repeats: int) -> float:
    """Padded tokens a second of a step of `samples` x `length`, once met (the median of `repeats`)."""
    torch.manual_seed(0)
    model = TinyLM(width=128, context=256)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    x, y = torch.randint(1, VOCAB, (samples, length)), torch.randint(0, VOCAB, (samples, length))

    def step() -> float:
        began = time.perf_counter()
        train_step(model, optimizer, x, y, precision)
        return time.perf_counter() - began

    step()
    return samples * length / statistics.median(step() for _ in range(repeats))


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               precision: str) -> None:
    """One step of the token benchmark's model as its script takes it (labels of -100 are ignored)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = F.cross_entropy(model(x).float().reshape(-1, VOCAB), y.reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cap", type=int, default=8192, help="padded tokens a token batch holds")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    shapes = [(args.cap // length, length) for length in LENGTHS] + [FIXED]
    rates = {(p, shape): padded_rate(p, *shape, args.repeats) for p in ("bf16", "fp32") for shape in shapes}
    lines = [f"`python -m benchmarks.padded_rate --cap {args.cap} --repeats {args.repeats}` ({os.cpu_count()} cores, "
             f"torch {torch.__version__}, {torch.get_num_threads()} threads)", "",
             "| batch (samples x length) | bf16 padded tokens/s | fp32 padded tokens/s |", "|---|---:|---:|"]
    for shape in shapes:
        name = f"{shape[0]} x {shape[1]}" + (" (the safe fixed batch)" if shape == FIXED else "")
        lines.append(f"| {name} | {rates['bf16', shape]:,.0f} | {rates['fp32', shape]:,.0f} |")
    publish("\n".join(lines) + "\n", os.path.join(HERE, "padded-rate-cpu.md"))


if __name__ == "__main__":
    main()
