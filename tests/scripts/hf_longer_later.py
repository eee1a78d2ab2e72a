"""A Hugging Face Trainer run whose memory need grows mid-training: 16-token sequences for the first
6 optimizer steps of 16 samples, then SEQ_LONG-token ones. Under a memory limit that fits the short
ones at the exported micro-batch but not the long ones, AutofitTrainer must lower its micro-batch,
keep the global batch and train to the end.

Writes {"step_losses": {step: loss}, "weights": state_dict} to $LOSSES_OUT (torch.save).
"""
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from autofit import autofit
from autofit.integrations.hf import AutofitTrainer

SHORT, LONG = 16, int(os.environ.get("SEQ_LONG", "512"))
STEPS, SHORT_STEPS, GLOBAL = 12, int(os.environ.get("SHORT_STEPS", "6")), 16


class Growing(torch.utils.data.IterableDataset):
    """In order (an iterable dataset: the Trainer does not shuffle it), seeded per sample."""

    def __iter__(self):
        for i in range(STEPS * GLOBAL):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, 512, (SHORT if i < SHORT_STEPS * GLOBAL else LONG,), generator=g)
            yield {"input_ids": ids, "labels": ids}


@autofit(global_batch=GLOBAL)
def train(run):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=LONG, n_embd=128, n_layer=4, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))  # same math at any micro-batch
    args = TrainingArguments(output_dir=os.environ.get("HF_OUT", "hf_out"), per_device_train_batch_size=4,
                             gradient_accumulation_steps=4, learning_rate=1e-3, max_steps=STEPS, logging_steps=1,
                             save_strategy="no", report_to="none", seed=0, disable_tqdm=True,
                             dataloader_num_workers=0)
    trainer = AutofitTrainer(run, model=model, args=args, train_dataset=Growing())
    trainer.train()
    losses = {entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry}
    torch.save({"step_losses": losses, "weights": model.state_dict()}, os.environ["LOSSES_OUT"])
    used = trainer.args
    print(f"hf_longer_later: per_device {used.per_device_train_batch_size} accumulation "
          f"{used.gradient_accumulation_steps} steps {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    train()
