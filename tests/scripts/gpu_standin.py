"""A GPU's costs on the CPU, for the tests and benchmarks that run every day without a GPU.

What decides a search on a GPU, and never shows on a 2-core CPU where probes are cheap and alike
(../shared/gpu/2026-11-26-nanogpt-h100.md: nanoGPT's own train.py at its defaults on an H100):
- a long one-off start before the first step, in every probe: nanoGPT's torch.compile took 36 s. Here a
  sleep (`STANDIN_START_S`, 8 s) before the first micro-batch stands in for it;
- a global batch kept by a large accumulation: 480 samples a step, 120 micro-batches of 4 (a step of
  them takes 2.9 s here, as nanoGPT's defaults take 3 s on an H100);
- a saturating device: a GPU's kernels run while the CPU waits, so a micro-batch's device time is a wait
  here too: a fixed part (`STANDIN_LAUNCH_S`, 20 ms: kernel launches, the idle tail) and a part per
  sample (`STANDIN_SAMPLE_S`, 2 ms). Per sample a step costs less as the micro-batch grows, less and less,
  and the same whatever else the machine's cores are doing;
- memory that rises with the micro-batch until the limit stops it: each sample's activation (8 MiB,
  really allocated and counted by the memory limit) is held from its forward to its backward.

A module-level script as people write them (nanoGPT's shape): it reads its micro-batch and accumulation
from `autofit.start` and keeps its own loop, clipping, optimizer and `.item()` logging; before any search
it trains at its own micro-batch of 12.
"""
import os
import time

import torch

import autofit

START_S = float(os.environ.get("STANDIN_START_S", "8"))
LAUNCH_S = float(os.environ.get("STANDIN_LAUNCH_S", "0.02"))
SAMPLE_S = float(os.environ.get("STANDIN_SAMPLE_S", "0.002"))
ACTIVATION_FLOATS = 2 * 2**20  # 8 MiB a sample, held for backward
max_iters = int(os.environ.get("STANDIN_ITERS", "4"))
batch_size = 12
gradient_accumulation_steps = 40  # 480 samples an optimizer step

run = autofit.start(global_batch=batch_size * gradient_accumulation_steps, default_batch_size=batch_size)
batch_size, gradient_accumulation_steps = run.batch_size, run.accumulation_steps
if run.probing:
    max_iters = 10**9  # a probe ends the script itself after its steps


class Device(torch.autograd.Function):
    """A layer whose work is the device's: its activation is held from forward to backward, and its time
    is a wait (a third in the forward, the rest in the backward)."""

    @staticmethod
    def forward(ctx, h):
        ctx.save_for_backward(torch.empty(h.shape[0], ACTIVATION_FLOATS))
        time.sleep((LAUNCH_S + SAMPLE_S * h.shape[0]) / 3)
        return h.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(2 * (LAUNCH_S + SAMPLE_S * grad.shape[0]) / 3)
        return grad


torch.set_num_threads(1)  # a GPU script's host side is one thread launching kernels (and OpenMP's idle
torch.manual_seed(0)      # team, woken after every wait, made steps vary 15% here)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

time.sleep(START_S)  # stands in for compilation: paid once, before the first step, in every run
for iteration in range(max_iters):
    for micro_step in range(gradient_accumulation_steps):
        x = torch.randn(batch_size, 64)
        loss = Device.apply(model(x)).pow(2).mean() / gradient_accumulation_steps
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"iter {iteration}: loss {loss.item() * gradient_accumulation_steps:.4f}", flush=True)
