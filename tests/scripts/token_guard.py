"""Batches by tokens (`run.token_batches`) with a tiny causal attention model, run normally: most samples
4-16 tokens, three of 32 at the end of the length range. Prints each optimizer step's loss (the token
mean over its micro-batches, however they were cut: `run.micro_step` is 0 once per step) and the
forward passes it took; writes the final weights to $WEIGHTS_OUT."""
import os

import torch
import torch.nn.functional as F

from autofit import autofit

PAD = -100
_g = torch.Generator().manual_seed(0)
LENGTHS = [int(n) for n in torch.randint(4, 17, (40,), generator=_g)] + [32, 32, 32]
ITEMS = [torch.randint(0, 11, (n,), generator=_g) for n in LENGTHS]


def collate(items):
    longest = max(len(t) for t in items)
    x = torch.zeros(len(items), longest, dtype=torch.long)
    y = torch.full((len(items), longest), PAD)
    for row, t in enumerate(items):
        x[row, :len(t)], y[row, :len(t)] = t, t
    return x, y


class CausalLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 16)
        self.attention = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = torch.nn.Linear(16, 11)

    def forward(self, x):
        h = self.embed(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), diagonal=1)
        return self.head(h + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0])


@autofit(default_batch_size=4)
def train(run):
    torch.manual_seed(0)
    model = CausalLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = run.token_batches(ITEMS, LENGTHS, collate_fn=collate, seed=3)
    steps, forwards = [], 0
    for x, y in run.batches(loader):
        if run.micro_step == 0:
            steps.append([0.0, 0])
        with run.autocast():
            loss = F.cross_entropy(model(x).reshape(-1, 11), y.reshape(-1), ignore_index=PAD)
        tokens = int((y != PAD).sum())
        steps[-1][0] += loss.item() * tokens
        steps[-1][1] += tokens
        forwards += 1
        run.backward(loss, opt)
    print("token_guard: losses " + " ".join(f"{total / tokens:.8f}" for total, tokens in steps), flush=True)
    print(f"token_guard: forwards {forwards} steps {run.optimizer_steps}", flush=True)
    torch.save(model.state_dict(), os.environ["WEIGHTS_OUT"])


if __name__ == "__main__":
    train()
