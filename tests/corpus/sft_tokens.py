"""Supervised fine-tuning of a small causal language model over conversations of very different lengths,
batched by tokens: `run.token_batches` cuts micro-batches whose padded size (samples x the longest in the
batch) stays within the config's `max_tokens`, so a search finds the largest cap that fits, and the long
samples that come once an epoch cannot run a normal run out of memory.

The lengths follow ShareGPT's long tail, as the vLLM paper (Kwon et al., "Efficient Memory Management for
Large Language Model Serving with PagedAttention", SOSP 2023, section 6.1 and its figure 11) describes the
data set: on average about 161 prompt tokens and 338 response tokens per conversation, the total capped at
the models' 2048-token context. Approximated here by a lognormal of the total length with mean 500 tokens
(sigma 0.9, so a median near 335 and a tail past 2048), clipped to [32, 2048], then scaled down 8 times
for a CPU: lengths 4..256, mean about 62 tokens. (The two means are quoted from the paper's figure as read,
the shape is an approximation; nothing here depends on the exact figures.)

Padded per batch (`collate`); the loss is the mean over each micro-batch's real response tokens
(`ignore_index` on padding), the usual SFT loss. Token ids are seeded random numbers built at import.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

from autofit import autofit

VOCAB, PAD, IGNORE = 256, 0, -100
SAMPLES = 512
SCALE = 8


def sharegpt_like_lengths(n: int, seed: int = 0, scale: int = SCALE) -> list[int]:
    """Total tokens per conversation: lognormal(mean 500, sigma 0.9) clipped to [32, 2048], divided by `scale`."""
    sigma = 0.9
    mu = math.log(500) - sigma**2 / 2  # a lognormal's mean is exp(mu + sigma^2 / 2)
    generator = torch.Generator().manual_seed(seed)
    drawn = torch.exp(mu + sigma * torch.randn(n, generator=generator)).clamp(32, 2048)
    return [max(4, int(v) // scale) for v in drawn.tolist()]


LENGTHS = sharegpt_like_lengths(SAMPLES)


class Conversations(torch.utils.data.Dataset):
    """A prompt then a response, token ids; the response is about two thirds of the tokens (338 of 499)."""

    def __init__(self, lengths: list[int], seed: int = 1) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.items = []
        for n in lengths:
            tokens = torch.randint(1, VOCAB, (n,), generator=generator)
            labels = tokens.clone()
            labels[: max(1, n // 3)] = IGNORE  # no loss on the prompt
            self.items.append((tokens, labels))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index]


DATA = Conversations(LENGTHS)


def collate(items):
    """Pad to the batch's longest: inputs with PAD, labels with IGNORE (shifted by one for next-token loss)."""
    longest = max(len(tokens) for tokens, _ in items)
    x = torch.full((len(items), longest), PAD, dtype=torch.long)
    y = torch.full((len(items), longest), IGNORE, dtype=torch.long)
    for row, (tokens, labels) in enumerate(items):
        x[row, : len(tokens)] = tokens
        y[row, : len(tokens) - 1] = labels[1:]
    return x, y


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        causal = torch.triu(torch.ones(length, length, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, width: int = 64, heads: int = 4, layers: int = 2, context: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.head = nn.Linear(width, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.position(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            h = block(h)
        return self.head(h)


@autofit
def train(run):
    torch.manual_seed(0)
    model = TinyLM().to(run.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    loader = run.token_batches(DATA, LENGTHS, collate_fn=collate, seed=0)
    epochs = 10**6 if run.probing else 1  # a probe stops itself after its steps
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for x, y in run.batches(loader):
            with run.autocast():
                logits = model(x)
                loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1), ignore_index=IGNORE)
            run.backward(loss, optimizer)
    print(f"sft_tokens: done, {run.optimizer_steps} optimizer steps", flush=True)


if __name__ == "__main__":
    train()
