"""A GPU that pays for each new shape, on the CPU (issue 53: on an H200, a bf16 micro-batch of a length-sorted
token batcher took about 0.2 s, a tf32 one 15 ms; nearly every batch had a new padded length): the launch-bound
stand-in of tests/scripts/tokens_standin.py, whose first micro-batch of each shape (samples x padded length)
the process meets costs `SHAPE_S` more, as a library that builds a plan per shape and keeps it (cuDNN's
attention graphs) makes it cost.

- a micro-batch's device time is a wait: `LAUNCH_S` (40 ms) + `TOKEN_S` (1 us) a padded token, + `SHAPE_S`
  (0.2 s) at a shape the process has not met; the waits add up on a device clock, and a run prints its real
  tokens per device second (`tokens/device-s`), a figure the machine's load does not move;
- the collate pads a batch to its longest sample rounded up to `run.pad_multiple`: unpadded, an epoch meets a
  new shape at almost every batch; padded to 64, a handful, for a few more padded tokens;
- memory as the stand-in's: 512 MiB held for the run, 64 KiB a padded token from forward to backward;
- a short start in every probe (`STANDIN_START_S`, 2 s).

A normal run trains one epoch and prints its figures; `step_seconds` and `LENGTHS` let a test price an epoch."""
import math
import os
import time
from functools import partial

import torch
import torch.nn.functional as F

from autofit import autofit

PAD, VOCAB = -100, 64
LAUNCH_S, TOKEN_S, SHAPE_S = 0.04, 1e-6, 0.2
TOKEN_FLOATS = 2**14  # 64 KiB a padded token, held for backward
STATE_FLOATS = 2**27  # 512 MiB, held for the run
START_S = float(os.environ.get("STANDIN_START_S", "2"))
SEEN: set[tuple[int, int]] = set()  # the shapes this process met: the library's plans, kept


def long_tailed_lengths(n: int, seed: int = 0) -> list[int]:
    """Lognormal (median about 150 tokens, sigma 0.9) clipped to [16, 1024], the longest 1024."""
    generator = torch.Generator().manual_seed(seed)
    drawn = torch.exp(math.log(150) + 0.9 * torch.randn(n, generator=generator)).clamp(16, 1024)
    return [int(v) for v in drawn.tolist()[:-1]] + [1024]


LENGTHS = long_tailed_lengths(2000)
_g = torch.Generator().manual_seed(1)
ITEMS = [torch.randint(0, VOCAB, (n,), generator=_g) for n in LENGTHS]


def step_seconds(samples: int, width: int, new: bool) -> float:
    """A micro-batch's device time: launch-bound, and a new shape's plan on top."""
    return LAUNCH_S + TOKEN_S * samples * width + (SHAPE_S if new else 0.0)


def collate(items, multiple: int = 1):
    longest = -(-max(len(t) for t in items) // multiple) * multiple
    x = torch.zeros(len(items), longest, dtype=torch.long)
    y = torch.full((len(items), longest), PAD)
    for row, t in enumerate(items):
        x[row, :len(t)], y[row, :len(t)] = t, t
    return x, y


class Device(torch.autograd.Function):
    """A layer whose work is the device's: its activation held from forward to backward, its time a wait (a third
    in the forward, the rest in the backward); a shape met for the first time pays its plan in the forward."""

    @staticmethod
    def forward(ctx, h):
        shape = (h.shape[0], h.shape[1])
        new = shape not in SEEN
        SEEN.add(shape)
        ctx.save_for_backward(torch.empty(h.shape[0] * h.shape[1], TOKEN_FLOATS))
        time.sleep(step_seconds(*shape, new=False) / 3 + (SHAPE_S if new else 0.0))
        return h.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(2 * step_seconds(grad.shape[0], grad.shape[1], new=False) / 3)
        return grad


@autofit
def train(run):
    torch.set_num_threads(1)  # a GPU script's host side: one thread launching kernels
    torch.manual_seed(0)
    state = torch.empty(STATE_FLOATS)  # noqa: F841 (the model's state on the device, never read here)
    time.sleep(START_S)  # stands in for the device's start: paid once, before the first step, in every run
    embed, head = torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB)
    optimizer = torch.optim.SGD([*embed.parameters(), *head.parameters()], lr=0.01)
    loader = run.token_batches(ITEMS, LENGTHS, collate_fn=partial(collate, multiple=run.pad_multiple))
    device_s, real, micro, seen = 0.0, 0, 0, len(SEEN)
    for epoch in range(10**6 if run.probing else 1):
        loader.set_epoch(epoch)
        for x, y in run.batches(loader):
            new = (x.shape[0], x.shape[1]) not in SEEN
            loss = F.cross_entropy(head(Device.apply(embed(x))).flatten(0, 1), y.flatten(), ignore_index=PAD)
            run.backward(loss, optimizer)
            device_s += step_seconds(x.shape[0], x.shape[1], new)
            real, micro = real + int((y != PAD).sum()), micro + 1
    print(f"tokens_shapes: {micro} micro-batches, {len(SEEN) - seen} shapes, {real} real tokens, "
          f"{real / device_s:.0f} tokens/device-s", flush=True)


if __name__ == "__main__":
    train()
