"""A module-level script that registers a global forward hook before its `autofit.start` call (a profiler,
a logger), and fails if it finds more than its own: a persistent worker runs the script's top once at load
(up to its start call) and again in every probe, so what the top does must happen once a probe."""
import torch
from torch.nn.modules import module as module_hooks

import autofit

calls = []
module_hooks.register_module_forward_pre_hook(lambda module, args: calls.append(1))
if len(module_hooks._global_forward_pre_hooks) != 1:
    raise RuntimeError(f"{len(module_hooks._global_forward_pre_hooks)} global forward hooks: an earlier run's are here")

run = autofit.start(batch_range=(4, 32), precision="fp32")
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(10**9 if run.probing else 5):
    loss = model(torch.randn(run.batch_size, 8)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
