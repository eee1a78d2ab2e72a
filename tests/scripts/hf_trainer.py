"""A Hugging Face Trainer script as people write them, with the three lines autofit needs (marked).
A small GPT-2 built from its config (no download) on generated token sequences."""
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from autofit import autofit  # autofit: 1
from autofit.integrations.hf import AutofitTrainer  # autofit: 2

SEQ_LEN = int(os.environ.get("SEQ_LEN", "128"))


class Tokens(torch.utils.data.Dataset):
    """Seeded random token sequences: the model learns their bigram-free statistics, enough to train."""

    def __init__(self, n: int) -> None:
        self.data = torch.randint(0, 512, (n, SEQ_LEN), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.data[i], "labels": self.data[i]}


DATA = Tokens(512)


def _model():
    return GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=SEQ_LEN, n_embd=128, n_layer=4, n_head=4))


# $MODEL_AT_IMPORT: the model is built once, at import, as many scripts do; in one process (CUDA's
# probes, --probe-process persistent) every probe meets the same model.
MODEL = _model() if os.environ.get("MODEL_AT_IMPORT") else None


@autofit(global_batch=16)  # autofit: 3 (a function around the Trainer, marked for search)
def train(run):
    torch.manual_seed(0)
    model = MODEL if MODEL is not None else _model()
    if MODEL is not None and any(vars(block).get("forward") for block in MODEL.transformer.h):
        raise RuntimeError("a block still has the checkpointing of an earlier run")
    args = TrainingArguments(output_dir=os.environ.get("HF_OUT", "hf_out"), per_device_train_batch_size=4,
                             gradient_accumulation_steps=4, learning_rate=1e-3, num_train_epochs=1,
                             logging_steps=10, save_strategy="no", report_to="none", seed=0)
    trainer = AutofitTrainer(run, model=model, args=args, train_dataset=DATA)  # was: Trainer(model=...
    result = trainer.train()
    used = trainer.args
    print(f"hf_trainer: per_device {used.per_device_train_batch_size} accumulation {used.gradient_accumulation_steps} "
          f"bf16 {used.bf16} steps {result.global_step} loss {result.training_loss:.3f}", flush=True)


if __name__ == "__main__":
    train()
