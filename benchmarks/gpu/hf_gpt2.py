"""GPT-2 small (124M) under the Hugging Face Trainer, through autofit's adapter: the GPU checklist's
`features` step searches it and runs the export (benchmarks/gpu/features.py).

The model is `GPT2LMHeadModel(GPT2Config())` (12 layers, width 768, context 1024, nothing downloaded) on
seeded random tokens; the script is written as HF's examples are, with the three autofit lines marked.
HF_GPT2_SAMPLES sets the epoch (default 512: 16 optimizer steps of the global batch of 32).
"""

from __future__ import annotations

import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from autofit import autofit  # autofit: 1
from autofit.integrations.hf import AutofitTrainer  # autofit: 2

SEQ_LEN = int(os.environ.get("GPT124M_SEQ", 1024))
SAMPLES = int(os.environ.get("HF_GPT2_SAMPLES", 512))


class Tokens(torch.utils.data.Dataset):
    """Seeded random GPT-2 token ids: throughput does not depend on the text."""

    def __init__(self, n: int) -> None:
        self.data = torch.randint(0, 50257, (n, SEQ_LEN), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.data[i], "labels": self.data[i]}


@autofit(global_batch=32, default_batch_size=8, default_precision="bf16")  # autofit: 3
def train(run):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_positions=SEQ_LEN, use_cache=False))
    args = TrainingArguments(output_dir=os.environ.get("HF_OUT", "hf_gpt2_out"), per_device_train_batch_size=8,
                             gradient_accumulation_steps=4, learning_rate=3e-4, num_train_epochs=1, bf16=True,
                             logging_steps=10, save_strategy="no", report_to="none", seed=0)
    trainer = AutofitTrainer(run, model=model, args=args, train_dataset=Tokens(SAMPLES))
    trainer.train()


if __name__ == "__main__":
    train()
