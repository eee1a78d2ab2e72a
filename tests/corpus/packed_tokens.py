"""Causal language-model training on packed documents, batched by tokens: documents are joined with an
end-of-document token into packs of a few documents each, and `run.token_batches` cuts micro-batches of
packs whose padded size (packs x the longest pack in the batch) stays within the config's `max_tokens`.
Packing without cross-contamination (Krell et al., "Efficient Sequence Packing without
Cross-contamination", 2021; what HF's `DataCollatorWithFlattening` does for flash attention): position ids
restart at each document, attention is causal within a document only, and no label crosses a document's
end, so a pack trains exactly as its documents would one by one.

The documents' lengths follow C4's (the English web corpus T5 was trained on): Dodge et al., "Documenting
Large Webtext Corpora: A Case Study on the Colossal Clean Crawled Corpus", EMNLP 2021, table 1, count
365M documents and 156B tokens in C4.EN, about 430 tokens per document. Approximated here by a lognormal
of mean 430 tokens (sigma 1.0, so a median near 260 and a tail past the 2048-token context, where a
document is truncated), clipped to [32, 2048], then scaled down 8 times for a CPU: 4..256 tokens, the
separator included. Packs hold at most three documents in data order (the packing depth Krell et al. use)
and at most the context, so the packs' lengths keep a long tail of their own: 4..256 tokens, mean about
140. (The figures are quoted from the table as read, the shape is an approximation; nothing here depends
on the exact figures.)

Padded per batch (`collate`); the loss is the mean over each micro-batch's predicted tokens. Token ids are
seeded random numbers built at import.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

from autofit import autofit

VOCAB, PAD, EOS, IGNORE = 256, 0, 1, -100
DOCUMENTS = 1536
SCALE = 8
CONTEXT = 2048 // SCALE
PACK_DEPTH = 3  # documents per pack at most


def c4_like_lengths(n: int, seed: int = 0) -> list[int]:
    """Tokens per document: lognormal(mean 430, sigma 1.0) clipped to [32, 2048], divided by SCALE."""
    sigma = 1.0
    mu = math.log(430) - sigma**2 / 2  # a lognormal's mean is exp(mu + sigma^2 / 2)
    generator = torch.Generator().manual_seed(seed)
    drawn = torch.exp(mu + sigma * torch.randn(n, generator=generator)).clamp(32, 2048)
    return [max(4, int(v) // SCALE) for v in drawn.tolist()]


def documents(lengths: list[int], seed: int = 1) -> list[torch.Tensor]:
    """Random token ids, each document ending with EOS (its length counts it)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.cat([torch.randint(2, VOCAB, (n - 1,), generator=generator), torch.tensor([EOS])])
            for n in lengths]


def pack(docs: list[torch.Tensor]) -> list[tuple[torch.Tensor, list[int]]]:
    """Greedy in data order: a pack closes when the next document would pass CONTEXT or PACK_DEPTH.
    Each pack: its tokens, and its documents' lengths (where attention and the labels stop)."""
    packs, tokens, sizes = [], [], []
    for doc in docs:
        if sizes and (sum(sizes) + len(doc) > CONTEXT or len(sizes) == PACK_DEPTH):
            packs.append((torch.cat(tokens), sizes))
            tokens, sizes = [], []
        tokens.append(doc)
        sizes.append(len(doc))
    packs.append((torch.cat(tokens), sizes))
    return packs


PACKS = pack(documents(c4_like_lengths(DOCUMENTS)))
LENGTHS = [len(tokens) for tokens, _ in PACKS]


class Packs(torch.utils.data.Dataset):
    def __init__(self, packs: list[tuple[torch.Tensor, list[int]]]) -> None:
        self.packs = packs

    def __len__(self) -> int:
        return len(self.packs)

    def __getitem__(self, index: int):
        return self.packs[index]


DATA = Packs(PACKS)


def collate(items):
    """Pad to the batch's longest pack. Inputs, position ids restarting at each document, document ids (-1 on
    padding) and next-token labels: IGNORE on padding and at each document's last token (what follows is the
    next document's)."""
    longest = max(len(tokens) for tokens, _ in items)
    x = torch.full((len(items), longest), PAD, dtype=torch.long)
    positions = torch.zeros((len(items), longest), dtype=torch.long)
    document = torch.full((len(items), longest), -1, dtype=torch.long)
    y = torch.full((len(items), longest), IGNORE, dtype=torch.long)
    for row, (tokens, sizes) in enumerate(items):
        x[row, : len(tokens)] = tokens
        start = 0
        for index, size in enumerate(sizes):
            end = start + size
            positions[row, start:end] = torch.arange(size)
            document[row, start:end] = index
            y[row, start : end - 1] = tokens[start + 1 : end]
            start = end
    return x, positions, document, y


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # (batch, heads, length, head width)
        x = x + self.out(h.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, width: int = 64, heads: int = 4, layers: int = 2, context: int = CONTEXT) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.head = nn.Linear(width, VOCAB)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, document: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        causal = torch.tril(torch.ones(length, length, dtype=torch.bool, device=x.device))
        # causal within a document: no token sees another document's (padding sees padding, never a NaN row)
        allowed = (causal & (document[:, :, None] == document[:, None, :]))[:, None]
        h = self.embed(x) + self.position(positions)
        for block in self.blocks:
            h = block(h, allowed)
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
        for x, positions, document, y in run.batches(loader):
            with run.autocast():
                logits = model(x, positions, document)
                loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1), ignore_index=IGNORE)
            run.backward(loss, optimizer)
    print(f"packed_tokens: done, {run.optimizer_steps} optimizer steps", flush=True)


if __name__ == "__main__":
    train()
