"""build-nanogpt's loop: a global batch of TOTAL samples a step (`--total`, 512 by default), reached by an
accumulation the loop works out itself from the micro-batch it is given (`grad_accum_steps = total_batch_size //
(B * T)`), reading neither run.accumulation_steps nor run.global_batch. At micro-batch 1 it runs TOTAL backward
passes a step. `--fp16-skips N`: under fp16 its GradScaler skips its first N steps (an overflowing loss while the
scale comes down), as a normal fp16 start does."""
import argparse

import torch

from autofit import autofit

parser = argparse.ArgumentParser()
parser.add_argument("--total", type=int, default=512)
parser.add_argument("--fp16-skips", type=int, default=0)
args = parser.parse_args()


@autofit(precision=("fp32", "fp16"), batch_range=(1, 64), default_batch_size=4)
def train(run):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(run.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fp16 = run.precision == "fp16"
    scaler = torch.amp.GradScaler(run.device.type, enabled=fp16)
    grad_accum_steps = max(1, args.total // run.batch_size)
    data = torch.randn(4096, 16)
    step, at = 0, 0
    while True:
        for _ in range(grad_accum_steps):
            x = data[at:at + run.batch_size].to(run.device)
            at = (at + run.batch_size) % (len(data) - run.batch_size)
            with run.autocast():
                loss = model(x).pow(2).mean() / grad_accum_steps
            if fp16 and step < args.fp16_skips:
                loss = loss * float("inf")  # an overflow, as the scale comes down from 2**16
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if not run.probing and step >= 20:
            return
