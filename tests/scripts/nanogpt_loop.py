"""A nanoGPT-style loop as people write it: a small causal transformer with tied token embedding and
output head, AdamW, a hand-made fp16 GradScaler (enabled only under fp16), grad clipping whose norm
is checked, and `loss.item()` logged every step. Under fake tensors every one of those reads a value."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from autofit import autofit

VOCAB, T, D, LAYERS, HEADS = 256, 64, 128, 2, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, HEADS, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(T, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.wte.weight  # weight tying, as nanoGPT does

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))


@autofit(batch_range=(4, 64), default_batch_size=8)
def train(run):
    torch.manual_seed(0)
    model = GPT().to(run.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    scaler = torch.amp.GradScaler(run.device.type, enabled=run.config.precision == "fp16")
    data = torch.randint(0, VOCAB, (256, T + 1), generator=torch.Generator().manual_seed(0))
    batches = [(data[i:i + run.batch_size, :-1], data[i:i + run.batch_size, 1:])
               for i in range(0, len(data) - run.batch_size + 1, run.batch_size)]
    step = 0
    while True:
        for x, y in run.batches(batches):
            with run.autocast():
                loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if not torch.isfinite(norm):
                print(f"step {step}: non-finite grad norm, skipped")
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            if torch.isnan(loss).any():
                raise RuntimeError("loss is nan")
            if step % 10 == 0:
                print(f"step {step} loss {loss.item():.4f} ppl {math.exp(loss.item()):.1f} "
                      f"norm {float(norm):.3f} tokens {x.numel()}")
            step += 1
