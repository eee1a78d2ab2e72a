"""A mixture-of-experts layer as people write it: a router picks the top-2 of 8 experts per token,
each expert gathers its tokens with `torch.where` (nonzero: a data-dependent size), runs them, and
scatters them back with `index_add_`. The count per expert is only known from the router's values."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from autofit import autofit

D, EXPERTS, TOP_K, T = 128, 8, 2, 32


class MoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(D, EXPERTS, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
                                     for _ in range(EXPERTS))

    def forward(self, x):
        tokens = x.reshape(-1, D)
        weights, chosen = self.router(tokens).softmax(-1).topk(TOP_K, dim=-1)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(chosen == e)
            if rows.numel() == 0:
                continue
            out.index_add_(0, rows, expert(tokens[rows]) * weights[rows, slot, None])
        return out.reshape(x.shape)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(D, D)
        self.moe1, self.moe2 = MoE(), MoE()
        self.out = nn.Linear(D, D)

    def forward(self, x):
        x = self.inp(x)
        x = x + self.moe1(F.layer_norm(x, (D,)))
        x = x + self.moe2(F.layer_norm(x, (D,)))
        return self.out(x)


@autofit(batch_range=(4, 256), default_batch_size=16)
def train(run):
    torch.manual_seed(0)
    model = Model().to(run.device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(run.batch_size, T, D, generator=g), torch.randn(run.batch_size, T, D, generator=g))
            for _ in range(4)]
    while True:
        for x, y in run.batches(data):
            with run.autocast():
                loss = F.mse_loss(model(x), y)
            run.backward(loss, opt)
