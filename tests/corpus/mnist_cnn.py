"""A CNN classifier in the style of pytorch/examples' mnist/main.py: argparse in main(), a Net with
two convolutions, dropout and two linear layers, Adadelta with a StepLR scheduler stepped per epoch,
`loss.item()` logged every log_interval batches, a test pass per epoch and an optional save.

Changed for autofit (marked `# autofit`): the import and the decorator, `main(run)`, the loader's
batch size from `run.batch_size`, the loop over `run.batches(train_loader)` (it moves each batch to
the device), the forward pass under `run.autocast()`, and `run.backward(loss, optimizer)` in place of
`optimizer.zero_grad(); loss.backward(); optimizer.step()` (autofit zeroes and steps at the end of
each optimizer step: a `zero_grad()` kept before every micro-batch would throw away accumulated ones);
the test pass and the save are skipped in a probe (`run.probing`).

Images are 28x28 seeded noise with a class-dependent bright square, generated at import (no download).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

from autofit import autofit  # autofit


def synthetic_mnist(n: int, seed: int) -> TensorDataset:
    """Stands in for datasets.MNIST(..., transform=Normalize((0.1307,), (0.3081,)))."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=generator)
    images = torch.rand(n, 1, 28, 28, generator=generator) * 0.3
    for digit in range(10):
        row, col = 2 + (digit // 5) * 12, 2 + (digit % 5) * 5
        images[labels == digit, :, row:row + 10, col:col + 4] += 0.7
    return TensorDataset((images - 0.1307) / 0.3081, labels)


TRAIN = synthetic_mnist(2048, seed=1)
TEST = synthetic_mnist(512, seed=2)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(4608, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def train(args, model, run, train_loader, optimizer, epoch):  # autofit: `run` in place of `device`
    model.train()
    for batch_idx, (data, target) in enumerate(run.batches(train_loader)):  # autofit
        with run.autocast():  # autofit
            output = model(data)
            loss = F.nll_loss(output.float(), target)
        run.backward(loss, optimizer)  # autofit: was zero_grad(), loss.backward(), optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)} "
                  f"({100. * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}", flush=True)
            if args.dry_run:
                break


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{len(test_loader.dataset)} "
          f"({100. * correct / len(test_loader.dataset):.0f}%)\n", flush=True)


@autofit(default_batch_size=64)  # autofit
def main(run):  # autofit
    parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
    parser.add_argument("--test-batch-size", type=int, default=1000, metavar="N")
    parser.add_argument("--epochs", type=int, default=2, metavar="N")
    parser.add_argument("--lr", type=float, default=1.0, metavar="LR")
    parser.add_argument("--gamma", type=float, default=0.7, metavar="M")
    parser.add_argument("--dry-run", action="store_true", default=False)
    parser.add_argument("--seed", type=int, default=1, metavar="S")
    parser.add_argument("--log-interval", type=int, default=10, metavar="N")
    parser.add_argument("--save-model", action="store_true", default=False)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    device = run.device  # autofit: was torch.device("cuda" if use_cuda else "cpu")

    train_loader = DataLoader(TRAIN, batch_size=run.batch_size, shuffle=True)  # autofit: was args.batch_size
    test_loader = DataLoader(TEST, batch_size=args.test_batch_size)

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1) if not run.probing else range(1, 10**6):  # autofit
        train(args, model, run, train_loader, optimizer, epoch)
        if run.probing:  # autofit
            continue
        test(model, device, test_loader)
        scheduler.step()

    if args.save_model:
        torch.save(model.state_dict(), "mnist_cnn.pt")
    print(f"mnist_cnn: done, {run.optimizer_steps} optimizer steps", flush=True)


if __name__ == "__main__":
    main()
