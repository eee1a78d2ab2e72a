"""The token benchmark's training script (benchmarks/tokens.py): the causal LM of tests/corpus/sft_tokens.py
over its ShareGPT-like conversation lengths (4..256 tokens, a long tail), $TOKENS_SAMPLES of them, one epoch.

Batched by tokens (`run.token_batches`: the config's `max_tokens`), or with --fixed as most scripts batch:
a shuffled DataLoader of `run.batch_size` samples, padded to each batch's longest. --longest: every sample
is the data set's longest (to find the largest fixed batch that survives it). Both count real
(non-padding) tokens; a run prints its padding share on its last line."""

from __future__ import annotations

import argparse
import os

import torch
from torch.nn import functional as F

from autofit import autofit
from tests.corpus.sft_tokens import IGNORE, PAD, VOCAB, Conversations, TinyLM, collate, sharegpt_like_lengths

parser = argparse.ArgumentParser()
parser.add_argument("--fixed", action="store_true", help="batch by a fixed number of samples")
parser.add_argument("--longest", action="store_true", help="every sample the longest one")
args, _ = parser.parse_known_args()

SAMPLES = int(os.environ.get("TOKENS_SAMPLES", "2048"))
WIDTH = int(os.environ.get("TOKENS_WIDTH", "128"))
LENGTHS = sharegpt_like_lengths(SAMPLES)
if args.longest:
    LENGTHS = [max(LENGTHS)] * 512
DATA = Conversations(LENGTHS)


def real_tokens(batch) -> int:
    """Tokens that are not padding (token ids start at 1; PAD is 0)."""
    x, _ = batch
    return int((x != PAD).sum())


@autofit(batch_range=(1, 512))
def train(run):
    torch.manual_seed(0)
    model = TinyLM(width=WIDTH).to(run.device)
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
