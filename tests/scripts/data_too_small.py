"""One pass over 16 samples through a DataLoader with drop_last=True: a batch above 16 yields nothing
(DataTooSmall), a batch of 4 gives 4 optimizer steps, fewer than a probe needs (ProbeTooShort)."""
import torch
from torch.utils.data import DataLoader, TensorDataset

from autofit import autofit

DATA = TensorDataset(torch.randn(16, 8))


@autofit
def train(run):
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for (x,) in run.batches(DataLoader(DATA, batch_size=run.batch_size, drop_last=True)):
        run.backward(model(x).pow(2).mean(), opt)
