"""A word-level LSTM language model in the style of pytorch/examples' word_language_model, not
written for autofit: its own batchify/get_batch data path (no DataLoader), BPTT windows, gradient
clipping and a plain SGD loop. Three lines changed to search it: the import, the decorator, and
the loop over `run.batches(...)` with `run.autocast()` / `run.backward()` in place of the hand-written
backward, clip and step (`run.backward(..., clip_grad_norm=CLIP)` clips before each step, as the
example does).

The corpus is a seeded random Zipf-like token stream generated at import (nothing downloaded).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from autofit import autofit  # changed line 1

NTOKENS = 10_000
EMSIZE = 400
NHID = 400
NLAYERS = 2
BPTT = 35
CLIP = 0.25
LR = 20.0
EPOCHS = 1
CORPUS_TOKENS = 120_000


def make_corpus(n: int = CORPUS_TOKENS, seed: int = 1111) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    ranks = torch.arange(1, NTOKENS + 1, dtype=torch.float)
    weights = 1.0 / ranks  # Zipf's law, as in natural text
    return torch.multinomial(weights, n, replacement=True, generator=generator)


CORPUS = make_corpus()


class RNNModel(nn.Module):
    """Encoder, stacked LSTM, decoder: the classic example model."""

    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float = 0.2) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid = nlayers, nhid
        self.encoder.weight.data.uniform_(-0.1, 0.1)
        self.decoder.weight.data.uniform_(-0.1, 0.1)
        self.decoder.bias.data.zero_()

    def forward(self, x: torch.Tensor, hidden):
        emb = self.drop(self.encoder(x))
        output, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(output)), hidden

    def init_hidden(self, bsz: int):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int):
    seq_len = min(BPTT, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)


def repackage_hidden(h):
    return tuple(v.detach() for v in h) if isinstance(h, tuple) else h.detach()


def windows(source: torch.Tensor):
    """Full BPTT windows, batch-major (the batch is the first dimension, as autofit counts samples)."""
    for i in range(0, source.size(0) - 1 - BPTT, BPTT):
        data, targets = get_batch(source, i)
        yield data.t(), targets


@autofit(default_batch_size=20)  # changed line 2
def train(run) -> float:
    torch.manual_seed(1111)
    model = RNNModel(NTOKENS, EMSIZE, NHID, NLAYERS).to(run.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    criterion = nn.NLLLoss()
    train_data = batchify(CORPUS, run.batch_size)
    loss = torch.tensor(math.nan)
    for _ in range(EPOCHS if not run.probing else 10**6):
        hidden = model.init_hidden(run.batch_size)
        # changed line 3: the loop, with autocast and backward from the Run API
        for data, targets in run.batches(windows(train_data), tokens=lambda b: b[0].numel()):
            hidden = repackage_hidden(hidden)
            with run.autocast():
                output, hidden = model(data.t(), hidden)
                loss = criterion(torch.log_softmax(output.float(), -1).view(-1, NTOKENS), targets)
            run.backward(loss, optimizer, clip_grad_norm=CLIP)
    return float(loss)


if __name__ == "__main__":
    train()
