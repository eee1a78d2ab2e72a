"""An Accelerate (no_trainer) run whose memory need grows mid-training: 16-token sequences for the
first 6 optimizer steps of 16 samples, then SEQ_LONG-token ones. Under a memory limit that fits the
short ones at the exported micro-batch but not the long ones, AutofitAccelerator must lower its
micro-batch inside the script's own loop, keep the global batch and train to the end.

Writes {"step_losses": {step: loss}, "weights": state_dict} to $LOSSES_OUT (torch.save); a step's
loss is its last micro-batch's, as scripts log it (after a lowering, the last piece's share of it).
"""
import os

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel, get_scheduler

from autofit import autofit
from autofit.integrations.accelerate import AutofitAccelerator

SHORT, LONG = 16, int(os.environ.get("SEQ_LONG", "512"))
STEPS, SHORT_STEPS, GLOBAL = 12, int(os.environ.get("SHORT_STEPS", "6")), 16


class Growing(Dataset):
    """In order (no shuffle), seeded per sample."""

    def __len__(self):
        return STEPS * GLOBAL

    def __getitem__(self, i):
        ids = torch.randint(0, 512, (SHORT if i < SHORT_STEPS * GLOBAL else LONG,),
                            generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


@autofit(global_batch=GLOBAL)
def train(run):
    torch.manual_seed(0)
    accelerator = AutofitAccelerator(run, gradient_accumulation_steps=4)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=LONG, n_embd=128, n_layer=4, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))  # same math at any micro-batch
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(Growing(), batch_size=4)
    scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0, num_training_steps=STEPS)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    model.train()
    completed, losses = 0, {}
    for batch in loader:
        with accelerator.accumulate(model):
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            losses[completed] = loss.item()  # the last micro-batch's (or piece's) loss, as scripts log it
            completed += 1
    torch.save({"step_losses": losses, "weights": accelerator.unwrap_model(model).state_dict()},
               os.environ["LOSSES_OUT"])
    print(f"accelerate_longer_later: micro-batch {loader.total_batch_size} accumulation "
          f"{accelerator.gradient_accumulation_steps} steps {completed}", flush=True)


if __name__ == "__main__":
    train()
