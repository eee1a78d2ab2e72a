"""A module-level script that compiles its model itself (`torch.compile`, as nanoGPT's train.py does with
compile=True) and evaluates it before its first step: its compilation is timed apart from its steps, though
autofit never offered it the knob."""
import torch
import torch.nn.functional as F

import autofit

run = autofit.start(global_batch=64, batch_range=(8, 64), precision="fp32")
torch.manual_seed(0)
model = torch.compile(torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
accumulation = run.accumulation_steps

with torch.no_grad():  # its own evaluation first, compiled too
    F.mse_loss(model(torch.randn(run.batch_size, 32)), torch.zeros(run.batch_size, 1)).item()
for step in range(10**9 if run.probing else 20):
    for micro in range(accumulation):
        x, y = torch.randn(run.batch_size, 32), torch.randn(run.batch_size, 1)
        (F.mse_loss(model(x), y) / accumulation).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
