"""The token benchmark's training script (benchmarks/tokens.py): the causal LM of tests/corpus/sft_tokens.py
over its ShareGPT-like conversation lengths (4..256 tokens, a long tail), $TOKENS_SAMPLES of them, one epoch.

Batched by tokens (`run.token_batches`: the config's `max_tokens`), or with --fixed as most scripts batch:
a shuffled DataLoader of `run.batch_size` samples, padded to each batch's longest. --longest: every sample
is the data set's longest (to find the largest fixed batch that survives it). Both count real
(non-padding) tokens; a run prints its padding share on its last line."""

from __future__ import annotations

import argparse
import math
import os

import torch
from torch import nn
from torch.nn import functional as F

from autofit import autofit
from tests.corpus.sft_tokens import IGNORE, PAD, VOCAB, Conversations, TinyLM, collate, sharegpt_like_lengths

parser = argparse.ArgumentParser()
parser.add_argument("--fixed", action="store_true", help="batch by a fixed number of samples")
parser.add_argument("--longest", action="store_true", help="every sample the longest one")
args, _ = parser.parse_known_args()

SAMPLES = int(os.environ.get("TOKENS_SAMPLES", "2048"))
WIDTH = int(os.environ.get("TOKENS_WIDTH", "128"))
#: ShareGPT's lengths divided by this (8: 4..256 tokens; 2: 16..1024).
SCALE = int(os.environ.get("TOKENS_SCALE", "8"))
#: "fused": nn.MultiheadAttention (PyTorch's scaled_dot_product_attention, no length² scores kept on CPU);
#: "eager": softmax(q kᵀ) written out, as HF's eager attention and many hand-written models are: it keeps
#: samples x heads x length² scores for backward, the memory a squares cap bounds.
ATTENTION = os.environ.get("TOKENS_ATTENTION", "fused")
LENGTHS = sharegpt_like_lengths(SAMPLES, scale=SCALE)
if args.longest:
    LENGTHS = [max(LENGTHS)] * 512
DATA = Conversations(LENGTHS)


class EagerAttention(nn.Module):
    """Causal self-attention with its scores written out (softmax(q kᵀ / √d) v)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)

    def forward(self, h, h2=None, h3=None, attn_mask=None, need_weights=False):
        b, n, w = h.shape
        q, k, v = (t.view(b, n, self.heads, w // self.heads).transpose(1, 2) for t in self.qkv(h).chunk(3, dim=-1))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(w // self.heads)
        scores = scores.masked_fill(attn_mask, float("-inf")).softmax(dim=-1)
        return self.out((scores @ v).transpose(1, 2).reshape(b, n, w)), None


def build_model() -> nn.Module:
    model = TinyLM(width=WIDTH, context=max(LENGTHS))
    if ATTENTION == "eager":
        for block in model.blocks:
            block.attention = EagerAttention(WIDTH, block.attention.num_heads)
    return model


def real_tokens(batch) -> int:
    """Tokens that are not padding (token ids start at 1; PAD is 0)."""
    x, _ = batch
    return int((x != PAD).sum())


@autofit(batch_range=(1, 512))
def train(run):
    torch.manual_seed(0)
    model = build_model().to(run.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    if args.fixed:
        loader = torch.utils.data.DataLoader(DATA, batch_size=run.batch_size, shuffle=True, collate_fn=collate,
                                             generator=torch.Generator().manual_seed(0))
    else:
        loader = run.token_batches(DATA, LENGTHS, collate_fn=collate, seed=0)
    real = padded = 0
    epochs = 10**6 if run.probing else 1  # a probe stops itself after its steps
    for epoch in range(epochs):
        if not args.fixed:
            loader.set_epoch(epoch)
        for x, y in run.batches(loader, tokens=real_tokens if args.fixed else None):
            real, padded = real + real_tokens((x, y)), padded + x.numel()
            with run.autocast():
                logits = model(x)
                loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1), ignore_index=IGNORE)
            run.backward(loss, optimizer)
    print(f"tokens_study: {run.optimizer_steps} optimizer steps, padding_share={1 - real / max(padded, 1):.4f}",
          flush=True)


if __name__ == "__main__":
    train()
