"""A DataLoader over 48 samples without drop_last, as the PyTorch examples build theirs: a batch larger
than the data yields the whole data as one short batch per epoch."""
import torch
from torch.utils.data import DataLoader, TensorDataset

from autofit import autofit

DATA = TensorDataset(torch.randn(48, 16), torch.randint(0, 4, (48,)))


@autofit(batch_range=(1, 256))
def train(run):
    model = torch.nn.Linear(16, 4).to(run.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(DATA, batch_size=run.batch_size, shuffle=True)
    for _ in range(10**6 if run.probing else 2):
        for x, y in run.batches(loader):
            with run.autocast():
                loss = torch.nn.functional.cross_entropy(model(x), y)
            run.backward(loss, optimizer)
