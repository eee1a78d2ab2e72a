"""Batches by tokens (`run.token_batches`) with a tiny causal attention model, for `autofit estimate`'s token
caps: 4000 samples of 6 tokens and one of 24. At a cap of 32 the long sample's batch is that sample alone
(24 padded tokens) and every other batch holds 5 short samples (30): an estimate that ran any batch but the
cap's worst would show more than 24 padded tokens."""
import torch
import torch.nn.functional as F

from autofit import autofit

PAD, VOCAB = -100, 64
LENGTHS = [24] + [6] * 4000
_g = torch.Generator().manual_seed(0)
ITEMS = [torch.randint(0, VOCAB, (n,), generator=_g) for n in LENGTHS]


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
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.attention = torch.nn.MultiheadAttention(32, 2, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
        self.head = torch.nn.Linear(32, VOCAB)

    def forward(self, x):
        h = self.embed(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device), diagonal=1)
        h = h + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        return self.head(h + self.mlp(h))


@autofit
def train(run):
    torch.manual_seed(0)
    model = CausalLM().to(run.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = run.token_batches(ITEMS, LENGTHS, collate_fn=collate, seed=3)
    for epoch in range(10**6 if run.probing else 1):
        loader.set_epoch(epoch)
        for x, y in run.batches(loader):
            with run.autocast():
                loss = F.cross_entropy(model(x).float().reshape(-1, VOCAB), y.reshape(-1), ignore_index=PAD)
            run.backward(loss, opt)
