"""A Llama-style decoder of about 1B parameters, built from its config (nothing downloaded), as an autofit study
where memory binds: what the features step's `memory` part searches (benchmarks/gpu/features.py, issue 51).

TinyLlama-1.1B's shape in plain PyTorch: 22 blocks of RMSNorm, causal attention (SDPA, 32 query heads over 4
key-value heads, RoPE) and a SwiGLU MLP (2048 -> 5632), vocabulary 32000, at 2048 tokens; AdamW, bf16 autocast
(fp32 weights). The weights, gradients and optimizer state take about 17 GB; what the blocks save for backward,
several GB a sample, is most of the rest, and the loss head's logits less: checkpointing the blocks lets a micro-batch
several times larger fit, whether or not it pays. The model is built on the run's device (no copy from the host);
the data are seeded random tokens generated at import.

Set LLAMA_LAYERS / LLAMA_WIDTH / LLAMA_FFN / LLAMA_HEADS / LLAMA_KV_HEADS / LLAMA_VOCAB / LLAMA_SEQ / LLAMA_SAMPLES
to shrink it (a CPU check: LLAMA_LAYERS=2 LLAMA_WIDTH=64 LLAMA_FFN=128 LLAMA_HEADS=4 LLAMA_KV_HEADS=2 LLAMA_VOCAB=256
LLAMA_SEQ=64).
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from autofit import autofit
from autofit.runtime import Run

LAYERS = int(os.environ.get("LLAMA_LAYERS", 22))
WIDTH = int(os.environ.get("LLAMA_WIDTH", 2048))
FFN = int(os.environ.get("LLAMA_FFN", 5632))
HEADS = int(os.environ.get("LLAMA_HEADS", 32))
KV_HEADS = int(os.environ.get("LLAMA_KV_HEADS", 4))
VOCAB = int(os.environ.get("LLAMA_VOCAB", 32000))
SEQ = int(os.environ.get("LLAMA_SEQ", 2048))
SAMPLES = int(os.environ.get("LLAMA_SAMPLES", 256))
ROPE_BASE = 10000.0


def rope(seq: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary embedding's cos and sin for `seq` positions of a head of `dim` (Llama's, base 10000)."""
    inverse = 1.0 / ROPE_BASE ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inverse)
    return torch.cat([angles, angles], dim=-1).cos(), torch.cat([angles, angles], dim=-1).sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Block(torch.nn.Module):
    """RMSNorm, grouped-query causal attention with RoPE, RMSNorm, SwiGLU; residual around each."""

    def __init__(self) -> None:
        super().__init__()
        self.head_dim = WIDTH // HEADS
        self.attention_norm = torch.nn.RMSNorm(WIDTH, eps=1e-5)
        self.q = torch.nn.Linear(WIDTH, HEADS * self.head_dim, bias=False)
        self.kv = torch.nn.Linear(WIDTH, 2 * KV_HEADS * self.head_dim, bias=False)
        self.o = torch.nn.Linear(HEADS * self.head_dim, WIDTH, bias=False)
        self.mlp_norm = torch.nn.RMSNorm(WIDTH, eps=1e-5)
        self.gate = torch.nn.Linear(WIDTH, FFN, bias=False)
        self.up = torch.nn.Linear(WIDTH, FFN, bias=False)
        self.down = torch.nn.Linear(FFN, WIDTH, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.attention_norm(x)
        q = self.q(h).view(b, t, HEADS, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2, KV_HEADS, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, -1))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.layers = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = torch.nn.RMSNorm(WIDTH, eps=1e-5)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        cos, sin = rope(SEQ, WIDTH // HEADS)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for name, p in self.named_parameters():  # Llama's initialization: normal(0, 0.02), norms at one
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        cos, sin = self.cos[:tokens.shape[1]], self.sin[:tokens.shape[1]]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head(self.norm(x))


def parameter_count() -> int:
    """The model's parameter count, from its shape."""
    head_dim = WIDTH // HEADS
    block = WIDTH * HEADS * head_dim * 2 + WIDTH * 2 * KV_HEADS * head_dim + 3 * WIDTH * FFN + 2 * WIDTH
    return 2 * VOCAB * WIDTH + LAYERS * block + WIDTH


TOKENS = torch.randint(0, VOCAB, (SAMPLES, SEQ + 1), generator=torch.Generator().manual_seed(0))


@autofit(batch_range=(1, 256), default_batch_size=1)
def train(run: Run) -> float:
    """Next-token training on seeded tokens; one pass when run normally."""
    torch.manual_seed(0)
    with torch.device(run.device):
        model = Llama()
    run.checkpoint(model.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=run.device.type == "cuda")
    loader = DataLoader(TensorDataset(TOKENS), batch_size=run.batch_size, shuffle=True, drop_last=True,
                        pin_memory=run.device.type == "cuda")
    loss = torch.tensor(math.nan)
    for _ in range(1 if not run.probing else 10**6):
        for (batch,) in run.batches(loader, tokens=SEQ):
            with run.autocast():
                logits = model(batch[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
            run.backward(loss, optimizer)
    return float(loss)


if __name__ == "__main__":
    train()
