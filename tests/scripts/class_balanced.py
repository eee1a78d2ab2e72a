"""A classifier whose loss weights each class by how rare it is in the batch, counted with
`torch.bincount` (its size is the largest label, a value fake tensors do not have): the memory
estimator cannot follow its step and says what it still knows."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from autofit import autofit

CLASSES, D = 10, 512


@autofit(batch_range=(8, 512), default_batch_size=32)
def train(run):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, CLASSES))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(run.batch_size, D, generator=g), torch.randint(0, CLASSES, (run.batch_size,), generator=g))
            for _ in range(4)]
    while True:
        for x, y in run.batches(data):
            counts = torch.bincount(y, minlength=CLASSES).float()
            weight = counts.sum() / (counts.clamp(min=1) * len(counts))
            loss = F.cross_entropy(model(x), y, weight=weight)
            run.backward(loss, opt)
