"""A nanoGPT-style GPT-2 small (124M) built from a config, as an autofit study.

The model follows Karpathy's nanoGPT `model.py` (written here from its description, not copied):
12 blocks of pre-norm causal self-attention through `F.scaled_dot_product_attention` (flash
attention on a GPU) and a 4x GELU MLP, the token embedding tied to the output layer, vocabulary
padded to 50304. AdamW is the fused CUDA kernel where there is one. The data path is nanoGPT's
`get_batch`: random windows of a token array, pinned and copied without blocking. The script
offers every knob autofit searches: micro-batch and accumulation (global batch kept), precision,
block checkpointing (`run.checkpoint`) and `torch.compile` (`run.compile`).

Set NANOGPT_SEQ / NANOGPT_LAYERS / NANOGPT_WIDTH / NANOGPT_VOCAB to shrink it for a CPU run;
NANOGPT_LAYERS=48 NANOGPT_WIDTH=1600 is GPT-2 XL (1.5B), where memory binds on one GPU.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from autofit import autofit
from autofit.runtime import Run

SEQ_LEN = int(os.environ.get("NANOGPT_SEQ", 1024))
N_LAYERS = int(os.environ.get("NANOGPT_LAYERS", 12))
WIDTH = int(os.environ.get("NANOGPT_WIDTH", 768))
N_HEADS = max(1, WIDTH // 64)
VOCAB = int(os.environ.get("NANOGPT_VOCAB", 50304))
N_TOKENS = int(os.environ.get("NANOGPT_TOKENS", 2_000_000))


class SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, seq, N_HEADS, width // N_HEADS).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # flash attention on a GPU
        return self.proj(y.transpose(1, 2).contiguous().view(batch, seq, width))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH)
        self.attn = SelfAttention()
        self.ln_2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(approximate="tanh"), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(SEQ_LEN, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(N_LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


TOKENS = torch.randint(0, VOCAB, (N_TOKENS,), generator=torch.Generator().manual_seed(0))


def get_batch(batch_size: int, generator: torch.Generator):
    """nanoGPT's get_batch: `batch_size` random windows of the token array (inputs, targets), pinned."""
    starts = torch.randint(len(TOKENS) - SEQ_LEN - 1, (batch_size,), generator=generator)
    x = torch.stack([TOKENS[i: i + SEQ_LEN] for i in starts.tolist()])
    y = torch.stack([TOKENS[i + 1: i + 1 + SEQ_LEN] for i in starts.tolist()])
    if torch.cuda.is_available():
        x, y = x.pin_memory(), y.pin_memory()
    return x, y


def batch_stream(batch_size: int, steps: int):
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        yield get_batch(batch_size, generator)


@autofit(batch_range=(1, 512), default_batch_size=8)
def train(run: Run) -> float:
    """Next-token training of a nanoGPT GPT-2 small on random tokens; 200 micro-batches when run normally."""
    torch.manual_seed(0)
    model = GPT().to(run.device)
    run.checkpoint(model.blocks)
    model = run.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=run.device.type == "cuda")
    loss = torch.tensor(math.nan)
    steps = 10**9 if run.probing else int(os.environ.get("NANOGPT_STEPS", 200))
    for x, y in run.batches(batch_stream(run.batch_size, steps), tokens=SEQ_LEN):
        with run.autocast():
            loss = model(x, y)
        run.backward(loss, opt, clip_grad_norm=1.0)
    return float(loss)


if __name__ == "__main__":
    train()
