"""A module-level training script not yet converted (no @autofit function, no autofit.start): importing it
trains. It leaves a file where $MODULE_LEVEL_RAN names one, so a test can tell whether any of it ran."""
import os

import torch

if os.environ.get("MODULE_LEVEL_RAN"):
    open(os.environ["MODULE_LEVEL_RAN"], "w").close()

model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(4, 8)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
