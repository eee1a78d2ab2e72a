"""A small causal language model over long-tailed lengths, batched by tokens: the model of issue 53's H200 run
(4 layers, width 256, a vocabulary of 512, causal attention through `scaled_dot_product_attention`; lengths
log-normal with a median of about 90 tokens, up to 1024; 1500 samples), as a user writes one.

Its collate pads a batch to its longest sample, rounded up to `run.pad_multiple` (1 unless a config pads):
where a library builds something per shape (cuDNN's attention graphs on a GPU, oneDNN's primitives in bf16 on
a CPU), a length-sorted epoch meets a new shape at almost every batch, and padding to a multiple meets a
handful. One epoch in a normal run. $VARLEN_SAMPLES, $VARLEN_LAYERS and $VARLEN_WIDTH shrink it for a test;
$VARLEN_FIXED=1 batches it as a plain loop does, `run.batch_size` shuffled samples padded to their longest.
"""

from __future__ import annotations

import math
import os
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from autofit import autofit

VOCAB, IGNORE = 512, -100
SAMPLES = int(os.environ.get("VARLEN_SAMPLES", "1500"))
LAYERS = int(os.environ.get("VARLEN_LAYERS", "4"))
WIDTH = int(os.environ.get("VARLEN_WIDTH", "256"))
HEADS = 4
LONGEST = 1024
FIXED = os.environ.get("VARLEN_FIXED") == "1"


def long_tailed_lengths(n: int, seed: int = 0) -> list[int]:
    """Log-normal lengths (median 90 tokens, sigma 0.9) clipped to [8, 1024], the last one 1024."""
    generator = torch.Generator().manual_seed(seed)
    drawn = torch.exp(math.log(90) + 0.9 * torch.randn(n, generator=generator)).clamp(8, LONGEST)
    return [int(v) for v in drawn.tolist()[:-1]] + [LONGEST]


LENGTHS = long_tailed_lengths(SAMPLES)
_generator = torch.Generator().manual_seed(1)
DATA = [torch.randint(0, VOCAB, (n,), generator=_generator) for n in LENGTHS]


def collate(items: list[torch.Tensor], multiple: int = 1):
    """Inputs and next-token labels, padded to the batch's longest rounded up to `multiple`."""
    longest = -(-max(len(t) for t in items) // multiple) * multiple
    x = torch.zeros(len(items), longest, dtype=torch.long)
    y = torch.full((len(items), longest), IGNORE, dtype=torch.long)
    for row, tokens in enumerate(items):
        x[row, : len(tokens)] = tokens
        y[row, : len(tokens) - 1] = tokens[1:]
    return x, y


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, w = x.shape
        q, k, v = (t.view(b, n, HEADS, w // HEADS).transpose(1, 2) for t in self.qkv(self.norm1(x)).chunk(3, dim=-1))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(b, n, w))
        return x + self.mlp(self.norm2(x))


class VarLenLM(nn.Module):
    def __init__(self, width: int = WIDTH, layers: int = LAYERS) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(VOCAB, width), nn.Embedding(LONGEST + 64, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.position(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


@autofit
def train(run):
    torch.manual_seed(0)
    model = VarLenLM().to(run.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    pad = partial(collate, multiple=run.pad_multiple)
    if FIXED:  # a plain loop: a fixed number of shuffled samples
        loader = torch.utils.data.DataLoader(DATA, batch_size=run.batch_size, shuffle=True, collate_fn=pad,
                                             generator=torch.Generator().manual_seed(0))
    else:
        loader = run.token_batches(DATA, LENGTHS, collate_fn=pad)
    real = (lambda batch: int((batch[1] != IGNORE).sum()) + len(batch[1])) if FIXED else None  # every sample's tokens
    for epoch in range(10**6 if run.probing else 1):  # a probe stops itself after its steps
        if not FIXED:
            loader.set_epoch(epoch)
        for x, y in run.batches(loader, tokens=real):
            with run.autocast():
                loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten(), ignore_index=IGNORE)
            run.backward(loss, optimizer)
    print(f"varlen_lm: done, {run.optimizer_steps} optimizer steps", flush=True)


if __name__ == "__main__":
    train()
