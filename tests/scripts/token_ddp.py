"""Batches by tokens across ranks: `run.distribute(model)` (DDP under torchrun), `run.token_batches` (each
rank as many micro-batches, dealt from the same length-bucketed epoch) and `@autofit(global_tokens=...)`
(the same accumulation on every rank). Each rank prints its micro-batches, accumulation and optimizer
steps; the main rank writes its final weights to $WEIGHTS_OUT."""
import os

import torch
import torch.nn.functional as F

from autofit import autofit

PAD = -100
_g = torch.Generator().manual_seed(0)
LENGTHS = [int(n) for n in torch.randint(2, 40, (96,), generator=_g)]
ITEMS = [torch.randint(0, 11, (n,), generator=_g) for n in LENGTHS]


def collate(items):
    longest = max(len(t) for t in items)
    x = torch.zeros(len(items), longest, dtype=torch.long)
    y = torch.full((len(items), longest), PAD)
    for row, t in enumerate(items):
        x[row, :len(t)], y[row, :len(t)] = t, t
    return x, y


@autofit(global_tokens=600, default_batch_size=4)
def train(run):
    torch.manual_seed(0)
    model = run.distribute(torch.nn.Sequential(torch.nn.Embedding(11, 16), torch.nn.Linear(16, 11)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = run.token_batches(ITEMS, LENGTHS, collate_fn=collate, seed=3)
    micro = 0
    for x, y in run.batches(loader):
        micro += 1
        loss = F.cross_entropy(model(x).reshape(-1, 11), y.reshape(-1), ignore_index=PAD)
        run.backward(loss, opt)
    print(f"token_ddp: rank {run.rank} micro {micro} accumulation {run.accumulation_steps} "
          f"steps {run.optimizer_steps}", flush=True)
    if run.is_main:
        torch.save({k.removeprefix("module."): v for k, v in model.state_dict().items()}, os.environ["WEIGHTS_OUT"])


if __name__ == "__main__":
    train()
