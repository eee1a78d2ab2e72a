"""GPT-2 small (124M parameters), built from a config (nothing downloaded), as an autofit study.

The model is Hugging Face's `GPT2LMHeadModel(GPT2Config())`: 12 layers, 12 heads, width 768,
context 1024, vocabulary 50257. The same model is what `benchmarks/gpu/finders.py` hands to
Lightning's and Hugging Face's batch-size finders, so the three answers are about one model.
The data are seeded random tokens generated at import (throughput does not depend on the text).

Set GPT124M_SEQ / GPT124M_LAYERS / GPT124M_WIDTH to shrink it for a CPU smoke test. GPT124M_SAVE_ON_CPU=1 wraps
each block's forward in PyTorch's `torch.autograd.graph.save_on_cpu(pin_memory=True)`, as autofit's offload ran
before its own (what the H200's offloaded probe of 2026-12-04 measured): a script's own offload, for the
estimator to count.
"""

from __future__ import annotations

import math
import os

import torch
from torch.utils.data import DataLoader, TensorDataset

from autofit import autofit
from autofit.runtime import Run

SEQ_LEN = int(os.environ.get("GPT124M_SEQ", 1024))
N_LAYERS = int(os.environ.get("GPT124M_LAYERS", 12))
WIDTH = int(os.environ.get("GPT124M_WIDTH", 768))
N_HEADS = max(1, WIDTH // 64)
VOCAB = 50257
N_SAMPLES = int(os.environ.get("GPT124M_SAMPLES", 4096))
SAVE_ON_CPU = os.environ.get("GPT124M_SAVE_ON_CPU") == "1"


def build_model():
    """GPT-2 small from its config (random weights): the 124M model, or a smaller one by env."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_positions=SEQ_LEN, n_embd=WIDTH, n_layer=N_LAYERS, n_head=N_HEADS,
                        vocab_size=VOCAB, use_cache=False)
    return GPT2LMHeadModel(config)


def make_tokens(n: int = N_SAMPLES, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n, SEQ_LEN), generator=generator)


TOKENS = make_tokens()


def saved_on_the_host(block: torch.nn.Module, device_type: str) -> None:
    """`block`'s forward with what it saves for backward in pinned host memory (PyTorch's `save_on_cpu`)."""
    forward = block.forward

    def offloaded(*args, **kwargs):
        with torch.autograd.graph.save_on_cpu(pin_memory=True, device_type=device_type):
            return forward(*args, **kwargs)

    block.forward = offloaded


@autofit(batch_range=(1, 1024), default_batch_size=8)
def train(run: Run) -> float:
    """Next-token training of GPT-2 small on seeded tokens; one pass when run normally."""
    torch.manual_seed(0)
    model = build_model().to(run.device)
    model.train()
    if SAVE_ON_CPU:
        for block in model.transformer.h:
            saved_on_the_host(block, run.device.type)
    run.checkpoint(model.transformer.h)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    loader = DataLoader(TensorDataset(TOKENS), batch_size=run.batch_size, shuffle=True, drop_last=True,
                        pin_memory=run.device.type == "cuda")
    loss = torch.tensor(math.nan)
    for _ in range(1 if not run.probing else 10**6):
        for (x,) in run.batches(loader, tokens=SEQ_LEN):
            with run.autocast():
                loss = model(input_ids=x, labels=x).loss
            run.backward(loss, opt)
    return float(loss)


if __name__ == "__main__":
    train()
