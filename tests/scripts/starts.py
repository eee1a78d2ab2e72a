"""A script without a function: `autofit.start` at module level and its own loop (its own optimizer step,
no run.batches): each sample holds a 1 MiB activation, so memory grows with the micro-batch. Its own
arguments: --record=FILE appends what this execution saw (its argv, its globals, its micro-batch)."""
import argparse
import json
import sys

import torch

import autofit

parser = argparse.ArgumentParser()
parser.add_argument("--record", default=None)
parser.add_argument("--twice", action="store_true")
parser.add_argument("--iters", type=int, default=100_000)
parser.add_argument("--wandb-api-key", default=None)  # a secret: never recorded as given
args = parser.parse_args()

SEEN = []  # rebuilt by every execution of the script: nothing of one probe reaches the next

run = autofit.start(batch_range=(1, 2048))
if args.twice:
    autofit.start()
SEEN.append(run.batch_size)
if args.record:
    with open(args.record, "a") as handle:
        handle.write(json.dumps({"argv": sys.argv[1:], "seen": SEEN, "batch_size": run.batch_size}) + "\n")

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(args.iters):
    x = torch.randn(run.batch_size, 64)
    wide = x.repeat(1, 4096)  # batch x 1 MiB, kept for backward
    loss = model(x).pow(2).mean() + wide.sigmoid().mean() * 1e-3
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print(f"done after {args.iters} steps")
