"""A script without a function (`autofit.start` at module level) whose loop guards its optimizer step: it skips
`optimizer.step()` for a non-finite loss, and its loss is always inf, so no step ever closes. --finite: its loss
is finite and it never steps at all (a loop that forgot its optimizer.step())."""
import sys

import torch

import autofit

run = autofit.start(batch_range=(1, 64))
finite = "--finite" in sys.argv[1:]
torch.manual_seed(0)
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
while True:
    loss = model(torch.randn(run.batch_size, 16)).pow(2).mean()
    if not finite:
        loss = loss * float("inf")
    loss.backward()
    if torch.isfinite(loss) and not finite:
        optimizer.step()
    optimizer.zero_grad()
