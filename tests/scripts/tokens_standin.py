"""A launch-bound GPU's costs by tokens, on the CPU (tests/e2e/test_gpu_costs.py): a small causal LM over
lengths long-tailed to 1024 tokens, batched by `run.token_batches`, as the H200 search of issue 43 ran one.

- a micro-batch's device time is a wait: a fixed part (`LAUNCH_S`, 40 ms: kernel launches, the idle tail)
  that dominates, and a small part per padded token (`TOKEN_S`, 1 us), the same whatever else the
  machine's cores do; the waits add up on a device clock, and a run prints its real tokens per device
  second (`tokens/device-s`), a figure the machine's load does not move;
- a long start before the first step in every probe (`STANDIN_START_S`, 8 s: a GPU process's CUDA context
  and its model moved to the device), so that a 2-minute budget holds a handful of probes, as 60 s held three
  on the H200;
- a large fixed part of the memory (512 MiB: weights, gradients, optimizer state, held for the run) and a
  small part per padded token beside the limit: each micro-batch's activation (64 KiB a padded token)
  held from its forward to its backward, both really allocated and counted by the memory limit. Under
  `--memory-limit 1600MiB` (1.41 GiB usable) the pilot's cap (4 of the longest samples: 4096 tokens) takes
  three quarters of the usable memory, the largest cap that fits is some 10,000 tokens, and the safe fixed
  batch (the longest samples' batch fits) some 10 samples.

A normal run trains one epoch and prints its figures; `step_seconds` and `LENGTHS` let a test price a fixed
batch's epoch with the same costs."""
import math
import os
import time

import torch
import torch.nn.functional as F

from autofit import autofit

PAD, VOCAB = -100, 64
LAUNCH_S, TOKEN_S = 0.04, 1e-6
TOKEN_FLOATS = 2**14  # 64 KiB a padded token, held for backward
STATE_FLOATS = 2**27  # 512 MiB, held for the run
START_S = float(os.environ.get("STANDIN_START_S", "8"))


def long_tailed_lengths(n: int, seed: int = 0) -> list[int]:
    """Lognormal (median about 150 tokens, sigma 0.9) clipped to [16, 1024], the longest 1024."""
    generator = torch.Generator().manual_seed(seed)
    drawn = torch.exp(math.log(150) + 0.9 * torch.randn(n, generator=generator)).clamp(16, 1024)
    return [int(v) for v in drawn.tolist()[:-1]] + [1024]


LENGTHS = long_tailed_lengths(2000)
_g = torch.Generator().manual_seed(1)
ITEMS = [torch.randint(0, VOCAB, (n,), generator=_g) for n in LENGTHS]


def step_seconds(padded_tokens: int) -> float:
    """A micro-batch's device time: launch-bound until the device saturates."""
    return LAUNCH_S + TOKEN_S * padded_tokens


def collate(items):
    longest = max(len(t) for t in items)
    x = torch.zeros(len(items), longest, dtype=torch.long)
    y = torch.full((len(items), longest), PAD)
    for row, t in enumerate(items):
        x[row, :len(t)], y[row, :len(t)] = t, t
    return x, y


class Device(torch.autograd.Function):
    """A layer whose work is the device's: its activation held from forward to backward, its time a wait
    (a third in the forward, the rest in the backward)."""

    @staticmethod
    def forward(ctx, h):
        ctx.save_for_backward(torch.empty(h.shape[0] * h.shape[1], TOKEN_FLOATS))
        time.sleep(step_seconds(h.shape[0] * h.shape[1]) / 3)
        return h.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(2 * step_seconds(grad.shape[0] * grad.shape[1]) / 3)
        return grad


@autofit
def train(run):
    torch.set_num_threads(1)  # a GPU script's host side: one thread launching kernels
    torch.manual_seed(0)
    state = torch.empty(STATE_FLOATS)  # noqa: F841 (the model's state on the device, never read here)
    time.sleep(START_S)  # stands in for the device's start: paid once, before the first step, in every run
    embed, head = torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB)
    optimizer = torch.optim.SGD([*embed.parameters(), *head.parameters()], lr=0.01)
    loader = run.token_batches(ITEMS, LENGTHS, collate_fn=collate)
    device_s, real, micro = 0.0, 0, 0
    for epoch in range(10**6 if run.probing else 1):
        loader.set_epoch(epoch)
        for x, y in run.batches(loader):
            loss = F.cross_entropy(head(Device.apply(embed(x))).flatten(0, 1), y.flatten(), ignore_index=PAD)
            run.backward(loss, optimizer)
            device_s, real, micro = device_s + step_seconds(x.numel()), real + int((y != PAD).sum()), micro + 1
    print(f"tokens_standin: {micro} micro-batches, {real} real tokens, {real / device_s:.0f} tokens/device-s",
          flush=True)


if __name__ == "__main__":
    train()
