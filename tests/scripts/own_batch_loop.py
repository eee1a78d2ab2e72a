"""A loop of its own that takes only its precision from autofit: a fixed 16 samples a step, whatever micro-batch
a probe's config says (issue 37, item 3: climbing that knob changed nothing but the samples counted, and the
largest was exported at a made-up 947,098 samples/s)."""
import torch

import autofit

run = autofit.start(precision="fp32")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
dtype = run.dtype
for step in range(10**9 if run.probing else 5):
    x = torch.randn(16, 32, dtype=dtype)
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
