"""A model built before the device is known, as many scripts do: a timm-style `create_model()`
factory builds it on the CPU at import (`model = create_model(...)` next to the config), the train
function moves it later (`model.to(device)`), builds the optimizer from the moved parameters and
an exponential moving average copy of the weights (timm's ModelEmaV2 style), and trains with a
OneCycleLR schedule stepped per batch, label smoothing and `loss.item()` logging.

Changed for autofit (marked `# autofit`): the import and the decorator, the loop in a function of
`run`, `run.device` where the script picked its device, the loader's batch size, `run.batches()`,
`run.autocast()`, `run.checkpoint(model.stages)` and `run.backward(loss, optimizer)`. The model stays
built at import: the search's probes each start from it as it was built (a CPU probe runs in a
process forked from the worker that imported the script), and the normal run moves it once.

Images are seeded 3x32x32 noise with class-dependent means, generated at import.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from autofit import autofit  # autofit

NUM_CLASSES, EPOCHS, LOG_EVERY = 10, 2, 10


def _images(n: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=generator)
    images = torch.randn(n, 3, 32, 32, generator=generator) + labels.view(-1, 1, 1, 1) * 0.1
    return TensorDataset(images, labels)


DATA = _images(1024, seed=0)


class ConvStage(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = nn.Conv2d(cin, cout, 1, bias=False) if cin != cout else nn.Identity()

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.max_pool2d(F.relu(y + self.down(x)), 2)


class SmallResNet(nn.Module):
    def __init__(self, widths=(16, 32, 64), num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU())
        self.stages = nn.ModuleList(ConvStage(cin, cout) for cin, cout in zip((widths[0], *widths[:-1]), widths))
        self.head = nn.Linear(widths[-1], num_classes)

    def forward(self, x):
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
        return self.head(x.mean((2, 3)))


_REGISTRY = {"small_resnet": SmallResNet}


def create_model(name: str, **kwargs) -> nn.Module:
    """timm.create_model in miniature: a name to a freshly initialised model, on the CPU."""
    return _REGISTRY[name](**kwargs)


torch.manual_seed(0)
model = create_model("small_resnet", num_classes=NUM_CLASSES)  # built at import, before any device is known


@autofit(default_batch_size=64)  # autofit
def train(run):  # autofit
    device = run.device  # autofit: was torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)  # moved now, built long before
    run.checkpoint(model.stages)  # autofit
    ema = copy.deepcopy(model).eval()
    for p in ema.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=True)
    loader = DataLoader(DATA, batch_size=run.batch_size, shuffle=True, drop_last=True)  # autofit
    epochs = EPOCHS if not run.probing else 10**6  # autofit
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=max(1, epochs * len(loader)))
    for epoch in range(epochs):
        model.train()
        for step, (images, labels) in enumerate(run.batches(loader)):  # autofit
            with run.autocast():  # autofit
                loss = F.cross_entropy(model(images).float(), labels, label_smoothing=0.1)
            run.backward(loss, optimizer)  # autofit: was zero_grad(); loss.backward(); optimizer.step()
            scheduler.step()
            with torch.no_grad():
                for e, p in zip(ema.state_dict().values(), model.state_dict().values()):
                    e.copy_(e * 0.99 + p * 0.01) if e.is_floating_point() else e.copy_(p)
            if step % LOG_EVERY == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.4f}",
                      flush=True)
    print(f"late_device: done, {run.optimizer_steps} optimizer steps", flush=True)


if __name__ == "__main__":
    train()
