"""Word-level LSTM language model in the style of pytorch/examples' word_language_model/main.py:
argparse at import, a Corpus, batchify/get_batch over BPTT windows, repackage_hidden, a hand-written
SGD update after clip_grad_norm_, `.item()` logging and lr annealing when validation stops improving.

Changed for autofit (marked `# autofit`): the import and the decorator, the epoch loop wrapped in a
function taking `run`, the batch size from `run.batch_size`, the windows iterated through
`run.batches()` and the forward pass under `run.autocast()`; evaluation and saving skipped in a
probe (`run.probing`). The example's own backward, clipping and update stay: a function that does
not call `run.backward()` is searched over micro-batch and precision, not accumulation.
Beyond the documented change: the example's windows are sequence-first (bptt, batch); autofit counts
a batch's samples on its first dimension, so they go to `run.batches()` batch-first and are turned
back inside the loop (`.t()`), else every batch size would count `bptt` samples a step.

The corpus is a seeded Zipf-like token stream generated at import (nothing downloaded).
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn as nn

from autofit import autofit  # autofit

parser = argparse.ArgumentParser(description="PyTorch Wikitext-2 RNN/LSTM Language Model (generated corpus)")
parser.add_argument("--emsize", type=int, default=64, help="size of word embeddings")
parser.add_argument("--nhid", type=int, default=64, help="number of hidden units per layer")
parser.add_argument("--nlayers", type=int, default=2, help="number of layers")
parser.add_argument("--lr", type=float, default=20, help="initial learning rate")
parser.add_argument("--clip", type=float, default=0.25, help="gradient clipping")
parser.add_argument("--epochs", type=int, default=2, help="upper epoch limit")
parser.add_argument("--bptt", type=int, default=35, help="sequence length")
parser.add_argument("--dropout", type=float, default=0.2, help="dropout applied to layers (0 = no dropout)")
parser.add_argument("--tied", action="store_true", help="tie the word embedding and softmax weights")
parser.add_argument("--seed", type=int, default=1111, help="random seed")
parser.add_argument("--log-interval", type=int, default=20, metavar="N", help="report interval")
parser.add_argument("--save", type=str, default="model.pt", help="path to save the final model")
args = parser.parse_args()

torch.manual_seed(args.seed)


class Corpus:
    """Stands in for data.Corpus: train/valid token streams over a fixed vocabulary."""

    def __init__(self, ntokens: int = 1000, train_tokens: int = 24_000, valid_tokens: int = 2_400) -> None:
        generator = torch.Generator().manual_seed(args.seed)
        weights = 1.0 / torch.arange(1, ntokens + 1, dtype=torch.float)  # Zipf's law, as in text
        self.ntokens = ntokens
        self.train = torch.multinomial(weights, train_tokens, replacement=True, generator=generator)
        self.valid = torch.multinomial(weights, valid_tokens, replacement=True, generator=generator)


corpus = Corpus()
eval_batch_size = 10


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            if nhid != ninp:
                raise ValueError("When using the tied flag, nhid must be equal to emsize")
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.nhid, self.nlayers = nhid, nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return torch.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].reshape(-1)
    return data, target


def windows(source):
    """The example's `for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt))`,
    batch-first for run.batches() (it counts samples on the first dimension)."""  # autofit
    for i in range(0, source.size(0) - 1, args.bptt):
        data, targets = get_batch(source, i)
        yield data.t(), targets.view(data.size(0), -1).t()


def evaluate(model, criterion, data_source, device):
    model.eval()
    total_loss = 0.
    hidden = model.init_hidden(eval_batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            data, targets = get_batch(data_source, i)
            output, hidden = model(data.to(device), hidden)
            hidden = repackage_hidden(hidden)
            total_loss += len(data) * criterion(output, targets.to(device)).item()
    return total_loss / (len(data_source) - 1)


@autofit(default_batch_size=20)  # autofit
def main(run):  # autofit: the example's top-level training code, in a function
    device = run.device
    train_data = batchify(corpus.train, run.batch_size)  # autofit: was args.batch_size
    val_data = batchify(corpus.valid, eval_batch_size)
    ntokens = corpus.ntokens
    model = RNNModel(ntokens, args.emsize, args.nhid, args.nlayers, args.dropout, args.tied).to(device)
    criterion = nn.NLLLoss()
    lr = args.lr
    best_val_loss = None

    def train(epoch):
        model.train()
        total_loss = 0.
        start_time = time.time()
        hidden = model.init_hidden(run.batch_size)
        for batch, (data, targets) in enumerate(run.batches(windows(train_data))):  # autofit
            data, targets = data.t(), targets.t().reshape(-1)  # back to the example's (bptt, batch)
            hidden = repackage_hidden(hidden)
            model.zero_grad()
            with run.autocast():  # autofit
                output, hidden = model(data, hidden)
                loss = criterion(output.float(), targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            total_loss += loss.item()
            if batch % args.log_interval == 0 and batch > 0:
                cur_loss = total_loss / args.log_interval
                elapsed = time.time() - start_time
                print(f"| epoch {epoch:3d} | {batch:5d}/{len(train_data) // args.bptt:5d} batches | lr {lr:02.2f} | "
                      f"ms/batch {elapsed * 1000 / args.log_interval:5.2f} | loss {cur_loss:5.2f} | "
                      f"ppl {math.exp(cur_loss):8.2f}", flush=True)
                total_loss = 0
                start_time = time.time()

    for epoch in range(1, args.epochs + 1) if not run.probing else range(1, 10**6):  # autofit
        epoch_start_time = time.time()
        train(epoch)
        if run.probing:  # autofit: a probe measures training steps only
            continue
        val_loss = evaluate(model, criterion, val_data, device)
        print("-" * 89)
        print(f"| end of epoch {epoch:3d} | time: {time.time() - epoch_start_time:5.2f}s | "
              f"valid loss {val_loss:5.2f} | valid ppl {math.exp(val_loss):8.2f}", flush=True)
        print("-" * 89)
        if not best_val_loss or val_loss < best_val_loss:
            with open(args.save, "wb") as f:
                torch.save(model.state_dict(), f)
            best_val_loss = val_loss
        else:
            lr /= 4.0  # anneal the learning rate if no improvement has been seen in the validation dataset
    print(f"word_language_model: done, best valid loss {best_val_loss:.2f}", flush=True)


if __name__ == "__main__":
    main()
