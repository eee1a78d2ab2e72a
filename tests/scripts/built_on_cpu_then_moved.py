"""A model built on the CPU, its weights tied and cast, then moved with `.to(run.device)` late, as a
script ported from a notebook does; an SGD optimizer with momentum (its state appears on the first step)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from autofit import autofit

VOCAB, D = 512, 256


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.body = nn.Sequential(nn.Linear(D, 4 * D), nn.ReLU(), nn.Linear(4 * D, D))
        self.unembed = nn.Linear(D, VOCAB, bias=False)
        self.unembed.weight = self.embed.weight

    def forward(self, idx):
        return self.unembed(self.body(self.embed(idx)))


@autofit(batch_range=(4, 128), default_batch_size=16)
def train(run):
    torch.manual_seed(0)
    model = TiedLM()
    model = model.float()
    model.train()
    model = model.to(run.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.randint(0, VOCAB, (128, 33), generator=torch.Generator().manual_seed(0))
    batches = [data[i:i + run.batch_size] for i in range(0, len(data) - run.batch_size + 1, run.batch_size)]
    while True:
        for seq in run.batches(batches):
            seq = seq.to(run.device)
            with run.autocast():
                logits = model(seq[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
            run.backward(loss, opt)
            losses = [loss.item()]
            if sum(losses) / len(losses) > 1e4:
                raise RuntimeError("diverged")
