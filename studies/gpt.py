"""A small character-level GPT: the classic activation-bound transformer.

Shape: the parameters are few (~0.8M; ~13 MiB with gradients and AdamW state), while every block
keeps its attention and MLP activations for backward (~5 MiB per sequence in fp32), so memory
grows linearly with the micro-batch and decides the largest batch. Under a 1.5 GiB cap on CPU
fp32 without checkpointing fits batch 192 and runs out of memory before 256; under the 1 GiB cap
the README's search uses, fp32 stops near batch 128 (a 0.94 GiB peak) and bf16 goes further. bf16 and activation
checkpointing each lower the peak at the same batch (at 256: over 1.5 GiB in fp32, ~1.0 GiB in
bf16, ~0.7 GiB in fp32 with all four blocks checkpointed, which pays for it with a second forward
pass per block; peaks include ~0.22 GiB of Python and torch).

The text is pseudo-English from a seeded grammar, generated at import (nothing is downloaded): 3,123
windows, which are the micro-batch's ceiling on a GPU, long before its memory is.

On a GPU it runs as it is (the README's first GPU command, `autofit search studies/gpt.py --budget 3m`): it
names no device, its model goes to `run.device` through `run.distribute` and its batches through
`run.batches`.

Under torchrun it is data parallel (`torchrun --nproc-per-node 2 studies/gpt.py`): `run.distribute`
with the blocks lets the config choose DDP or FSDP2, `run.sampler` gives each rank its shard; a
search with `--nproc-per-node 2` probes both.
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from autofit import autofit
from autofit.runtime import Run

SEQ_LEN = 128
N_LAYERS = 4
D_MODEL = 128
N_HEADS = 4
DROPOUT = 0.1
EPOCHS = 1  # a normal run: one pass over the text

# --- data ---------------------------------------------------------------------------------------
NOUNS = "cat dog bird fox horse child farmer king queen ship river tree stone house garden".split()
VERBS = "sees likes finds follows carries paints builds watches hears keeps leaves visits".split()
ADJECTIVES = "old young small great quiet bright dark green red happy slow clever".split()
PLACES = "by the river|in the garden|near the house|under the tree|on the hill|at dawn".split("|")


def make_text(n_chars: int = 200_000, seed: int = 0) -> str:
    """Seeded pseudo-English: 'the old fox follows a bright ship by the river.' and so on."""
    rng = random.Random(seed)
    sentences: list[str] = []
    size = 0
    while size < n_chars:
        subject = f"the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
        obj = f"a {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
        sentence = f"{subject} {rng.choice(VERBS)} {obj}"
        if rng.random() < 0.5:
            sentence += " " + rng.choice(PLACES)
        sentence = sentence[0].upper() + sentence[1:] + ". "
        sentences.append(sentence)
        size += len(sentence)
    return "".join(sentences)


TEXT = make_text()  # generated once, at import: probes do not pay for it
VOCAB = sorted(set(TEXT))
_INDEX = {c: i for i, c in enumerate(VOCAB)}
TOKENS = torch.tensor([_INDEX[c] for c in TEXT], dtype=torch.long)


class CharWindows(Dataset):
    """Windows of SEQ_LEN + 1 characters: inputs and next-character targets."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, stride: int) -> None:
        self.tokens, self.seq_len, self.stride = tokens, seq_len, stride

    def __len__(self) -> int:
        return (len(self.tokens) - self.seq_len - 1) // self.stride

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.tokens[i * self.stride : i * self.stride + self.seq_len + 1]
        return window[:-1], window[1:]


DATASET = CharWindows(TOKENS, SEQ_LEN, stride=64)


# --- model --------------------------------------------------------------------------------------
class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(
            nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(dropout)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (batch, heads, time, head size)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(
        self, vocab: int, seq_len: int, d: int, layers: int, heads: int, dropout: float
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            h = block(h)
        logits = self.head(self.ln(h))
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


# --- training -----------------------------------------------------------------------------------
@autofit(default_batch_size=32)
def train(run: Run) -> float:
    """Train the GPT for EPOCHS passes over the text; return the last loss."""
    torch.manual_seed(0)
    model = GPT(len(VOCAB), SEQ_LEN, D_MODEL, N_LAYERS, N_HEADS, DROPOUT)
    run.checkpoint(model.blocks)
    model = run.distribute(model, blocks=model.blocks)  # on run.device; DDP or FSDP2 under torchrun
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    sampler = run.sampler(DATASET)  # this rank's shard under torchrun, all of it otherwise
    loader = DataLoader(DATASET, batch_size=run.batch_size, sampler=sampler, drop_last=True)
    loss = torch.tensor(math.nan)
    for epoch in range(EPOCHS if not run.probing else 10**6):  # a probe ends by itself
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        for x, y in run.batches(loader, tokens=SEQ_LEN):
            with run.autocast():
                loss = model(x, y)
            run.backward(loss, opt)
        if not run.probing and run.is_main:
            print(f"gpt: epoch {epoch + 1}, loss {loss.item():.3f}")
    return loss.item()


if __name__ == "__main__":
    train()
