"""A wide MLP on synthetic tabular data: parameter- and optimizer-state-heavy.

Shape: ~17M parameters, so weights, gradients and AdamW's two moments take a fixed ~265 MiB
before a single sample is seen, and every step streams all of them through the optimizer.
Activations are small per sample, so memory grows slowly with the micro-batch and throughput keeps
rising with it for a long time: a small batch pays the whole optimizer step for few samples.
Under a 1.5 GiB cap on CPU every batch up to 1024 fits (peak ~0.65 GiB in fp32), so the answer
is the largest batch in the fastest precision.
The function never calls run.checkpoint() (there is nothing worth recomputing), so a search
spends no probes on checkpointing; it does use run.autocast().

The data is synthetic (nothing is downloaded): features from a seeded Gaussian, labels from a
fixed random "teacher" network, so there is a real function to learn.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from autofit import autofit
from autofit.runtime import Run

N_FEATURES = 256
N_CLASSES = 16
N_ROWS = 8192
HIDDEN = 2048
DEPTH = 4  # hidden layers
EPOCHS = 2


# --- data ---------------------------------------------------------------------------------------
def make_table(n: int = N_ROWS, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` rows of float features and the class a random two-layer teacher gives them."""
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(n, N_FEATURES, generator=g)
    w1 = torch.randn(N_FEATURES, 64, generator=g) / math.sqrt(N_FEATURES)
    w2 = torch.randn(64, N_CLASSES, generator=g)
    labels = (torch.tanh(features @ w1) @ w2).argmax(dim=1)
    return features, labels


FEATURES, LABELS = make_table()  # generated once, at import: probes do not pay for it
DATASET = TensorDataset(FEATURES, LABELS)


# --- model --------------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(
        self, features: int = N_FEATURES, hidden: int = HIDDEN, depth: int = DEPTH
    ) -> None:
        super().__init__()
        self.inp = nn.Linear(features, hidden)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.GELU())
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, N_CLASSES)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = h + layer(h)
        return F.cross_entropy(self.out(self.norm(h)).float(), y)


# --- training -----------------------------------------------------------------------------------
@autofit(default_batch_size=64)
def train(run: Run) -> float:
    """Train the MLP for EPOCHS; return the last loss. No run.checkpoint(): that knob is unused."""
    torch.manual_seed(0)
    model = MLP().to(run.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    loader = DataLoader(DATASET, batch_size=run.batch_size, shuffle=True, drop_last=True)
    loss = torch.tensor(math.nan)
    for epoch in range(EPOCHS if not run.probing else 10**6):  # a probe ends by itself
        for x, y in run.batches(loader):
            with run.autocast():
                loss = model(x, y)
            run.backward(loss, opt)
        if not run.probing:
            print(f"mlp: epoch {epoch + 1}, loss {loss.item():.3f}")
    return loss.item()


if __name__ == "__main__":
    train()
