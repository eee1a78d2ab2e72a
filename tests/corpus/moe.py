"""A mixture-of-experts transformer LM in the style of the common top-k MoE implementations
(Mixtral's sparse MoE block / the "makeMoE" and switch-transformer tutorials): a router picks the
top-2 experts per token (`torch.topk`), each expert takes its tokens by a data-dependent gather
(`torch.where(...)` / `nonzero`), and its weighted output is scattered back with `index_add_`; a
load-balancing auxiliary loss; AdamW, `clip_grad_norm_`, `loss.item()` and the fraction of tokens
each expert got logged every few steps.

Changed for autofit (marked `# autofit`): the import and the decorator, the loop in a function of
`run`, the loader's batch size, `run.batches()`, `run.autocast()`, `run.checkpoint(model.blocks)`
and `run.backward(loss, optimizer, clip_grad_norm=1.0)` in place of zero_grad/backward/clip/step.

Tokens are a seeded random stream generated at import (no download).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from autofit import autofit  # autofit

VOCAB, SEQ, WIDTH, LAYERS, HEADS = 512, 32, 64, 2, 2
N_EXPERTS, TOP_K, AUX_WEIGHT = 4, 2, 0.01
EPOCHS, LOG_EVERY = 2, 10

_generator = torch.Generator().manual_seed(0)
_tokens = torch.randint(0, VOCAB, (1024, SEQ + 1), generator=_generator)
DATA = TensorDataset(_tokens[:, :-1], _tokens[:, 1:])


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(WIDTH, 4 * WIDTH, bias=False)
        self.w2 = nn.Linear(4 * WIDTH, WIDTH, bias=False)
        self.w3 = nn.Linear(WIDTH, 4 * WIDTH, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # SwiGLU, as Mixtral's experts


class SparseMoE(nn.Module):
    """Top-k routing: every token goes to its k best experts, weighted by the renormalised gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(WIDTH, N_EXPERTS, bias=False)
        self.experts = nn.ModuleList(Expert() for _ in range(N_EXPERTS))

    def forward(self, hidden: torch.Tensor):
        batch, seq, width = hidden.shape
        flat = hidden.reshape(-1, width)
        router_logits = self.gate(flat)
        probs = F.softmax(router_logits, dim=1, dtype=torch.float)
        weights, selected = torch.topk(probs, TOP_K, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(hidden.dtype)
        out = torch.zeros_like(flat)
        for index, expert in enumerate(self.experts):
            token_idx, slot = (selected == index).nonzero(as_tuple=True)  # data-dependent: how many tokens
            if token_idx.numel() == 0:
                continue
            expert_out = expert(flat[token_idx]) * weights[token_idx, slot, None]
            out.index_add_(0, token_idx, expert_out.to(out.dtype))
        # Switch-style load balancing: fraction of tokens routed x mean router probability, per expert.
        routed = F.one_hot(selected, N_EXPERTS).float().sum(1).mean(0)
        aux = N_EXPERTS * (routed * probs.mean(0)).sum() / TOP_K
        return out.reshape(batch, seq, width), aux, routed.detach()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.moe = SparseMoE()
        self.register_buffer("mask", torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1), persistent=False)

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask, need_weights=False)[0]
        moe_out, aux, routed = self.moe(self.ln2(x))
        return x + moe_out, aux, routed


class MoELM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos(torch.arange(tokens.size(1), device=tokens.device))
        aux_total, routed_all = 0.0, []
        for block in self.blocks:
            x, aux, routed = block(x)
            aux_total = aux_total + aux
            routed_all.append(routed)
        return self.head(self.norm(x)), aux_total, torch.stack(routed_all)


@autofit(default_batch_size=32)  # autofit
def train(run):  # autofit
    torch.manual_seed(0)
    model = MoELM().to(run.device)
    run.checkpoint(model.blocks)  # autofit
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    loader = DataLoader(DATA, batch_size=run.batch_size, shuffle=True, drop_last=True)  # autofit
    step = 0
    for epoch in range(EPOCHS) if not run.probing else range(10**6):  # autofit
        for tokens, targets in run.batches(loader, tokens=SEQ):  # autofit
            with run.autocast():  # autofit
                logits, aux, routed = model(tokens)
                loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1)) + AUX_WEIGHT * aux
            run.backward(loss, optimizer, clip_grad_norm=1.0)  # autofit
            if step % LOG_EVERY == 0:
                share = " ".join(f"{value:.2f}" for value in routed[0].tolist())
                print(f"epoch {epoch} step {step} loss {loss.item():.4f} aux {float(aux):.3f} experts {share}",
                      flush=True)
            step += 1
    print(f"moe: done, {run.optimizer_steps} optimizer steps", flush=True)


if __name__ == "__main__":
    train()
