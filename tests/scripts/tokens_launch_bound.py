"""Batches by tokens where a step's time is mostly fixed (a GPU's kernel launches, played here by a sleep per
micro-batch) and its memory mostly attention's samples x heads x length² scores: 96 samples of 256 tokens and
2000 of 32 (with 24, the long ones made two batches an epoch, the worst one in the probe's warm-up and the
other in its five measured steps or not: the probe read a draw, not the epoch). The token cap the climb reaches is held by the long batches' scores (about 50 MiB more per 1024
tokens at 256), a larger one does not fit, and a batch of more tokens trains more tokens per second: the
search probes a squares cap (`max_squares`, per-length caps) after its climb. Whether the variant wins is
the probes' to say (on a CPU the short batches' scores add to the long ones' in the process's memory)."""
import time

import torch
import torch.nn.functional as F

from autofit import autofit

PAD, VOCAB, HEADS = -100, 64, 16
LENGTHS = [256] * 96 + [32] * 2000
_g = torch.Generator().manual_seed(0)
ITEMS = [torch.randint(0, VOCAB, (n,), generator=_g) for n in LENGTHS]


def collate(items):
    longest = max(len(t) for t in items)
    x = torch.zeros(len(items), longest, dtype=torch.long)
    y = torch.full((len(items), longest), PAD)
    for row, t in enumerate(items):
        x[row, :len(t)], y[row, :len(t)] = t, t
    return x, y


class ScoresLM(torch.nn.Module):
    """Attention with a one-wide head per score map, its scores written out: memory is the scores."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.qkv = torch.nn.Linear(16, 3 * HEADS)
        self.head = torch.nn.Linear(HEADS, VOCAB)

    def forward(self, x):
        n, length = x.shape
        q, k, v = (t.transpose(1, 2).unsqueeze(-1) for t in self.qkv(self.embed(x)).chunk(3, dim=-1))
        mask = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
        scores = (q @ k.transpose(-2, -1)).masked_fill(mask, float("-inf")).softmax(dim=-1)
        return self.head((scores @ v).squeeze(-1).transpose(1, 2))


@autofit
def train(run):
    torch.manual_seed(0)
    model = ScoresLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = run.token_batches(ITEMS, LENGTHS, collate_fn=collate)
    for epoch in range(10**6 if run.probing else 1):
        loader.set_epoch(epoch)
        for x, y in run.batches(loader):
            time.sleep(0.2)  # the launches of a step, whatever its size
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=PAD)
            run.backward(loss, optimizer)
    print("tokens_launch_bound: done", flush=True)


if __name__ == "__main__":
    train()
