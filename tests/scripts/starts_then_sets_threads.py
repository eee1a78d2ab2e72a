"""An autofit.start script that sets its own intra-op threads after its start call (to 1): its run trains on
them, whatever OMP_NUM_THREADS said when autofit.start ran."""
import torch

import autofit

run = autofit.start(default_batch_size=4)
torch.set_num_threads(1)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(10**9 if run.probing else 3):
    model(torch.randn(run.batch_size, 4)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
