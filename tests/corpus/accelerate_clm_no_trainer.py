#!/usr/bin/env python
# Written after Hugging Face's examples/pytorch/language-modeling/run_clm_no_trainer.py (Apache-2.0):
# causal language modeling with Accelerate, without the Trainer. A small GPT-2 built from its config
# and a seeded random-token corpus stand in for the hub's model and dataset (no downloads).
# Searched by autofit with the documented change only (the lines marked "autofit").
"""Fine-tune a causal language model with Accelerate."""

import argparse
import logging
import math
import os

import torch
from accelerate.logging import get_logger
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm
from transformers import GPT2Config, GPT2LMHeadModel, default_data_collator, get_scheduler

from autofit import autofit  # autofit
from autofit.integrations.accelerate import AutofitAccelerator  # autofit

logger = get_logger(__name__)


def parse_args():
    parser = argparse.ArgumentParser(description="Train a causal language model with Accelerate")
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--per_device_eval_batch_size", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=5e-4)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--num_train_epochs", type=int, default=1)
    parser.add_argument("--max_train_steps", type=int, default=None)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
    parser.add_argument("--lr_scheduler_type", type=str, default="linear")
    parser.add_argument("--num_warmup_steps", type=int, default=2)
    parser.add_argument("--max_grad_norm", type=float, default=1.0)
    parser.add_argument("--block_size", type=int, default=int(os.environ.get("BLOCK_SIZE", "64")))
    parser.add_argument("--train_samples", type=int, default=256)
    parser.add_argument("--eval_samples", type=int, default=32)
    parser.add_argument("--mixed_precision", type=str, default="no", choices=["no", "fp16", "bf16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", type=str, default=None)
    return parser.parse_args()


class RandomTokens(Dataset):
    """Seeded token blocks, as group_texts() would leave them: input_ids and labels alike."""

    def __init__(self, n, block_size, vocab_size, seed):
        self.blocks = torch.randint(0, vocab_size, (n, block_size), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        return {"input_ids": self.blocks[i], "attention_mask": torch.ones_like(self.blocks[i]), "labels": self.blocks[i]}


@autofit(global_batch=16)  # autofit
def main(run):  # autofit: was def main():
    args = parse_args()
    # autofit: was accelerator = Accelerator(gradient_accumulation_steps=..., mixed_precision=...)
    accelerator = AutofitAccelerator(run, gradient_accumulation_steps=args.gradient_accumulation_steps,
                                     mixed_precision=args.mixed_precision)
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    logger.info(accelerator.state, main_process_only=False)
    if args.seed is not None:
        set_seed(args.seed)

    config = GPT2Config(vocab_size=512, n_positions=args.block_size, n_embd=128, n_layer=4, n_head=4)
    model = GPT2LMHeadModel(config)
    train_dataset = RandomTokens(args.train_samples, args.block_size, config.vocab_size, seed=1)
    eval_dataset = RandomTokens(args.eval_samples, args.block_size, config.vocab_size, seed=2)

    train_dataloader = DataLoader(train_dataset, shuffle=True, collate_fn=default_data_collator,
                                  batch_size=args.per_device_train_batch_size)
    eval_dataloader = DataLoader(eval_dataset, collate_fn=default_data_collator,
                                 batch_size=args.per_device_eval_batch_size)

    # Optimizer: split weights in two groups, one with weight decay and the other not.
    no_decay = ["bias", "layer_norm.weight", "ln_1.weight", "ln_2.weight", "ln_f.weight"]
    optimizer_grouped_parameters = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": args.weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate)

    # Scheduler and math around the number of training steps.
    overrode_max_train_steps = False
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
        overrode_max_train_steps = True

    lr_scheduler = get_scheduler(
        name=args.lr_scheduler_type,
        optimizer=optimizer,
        num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
        num_training_steps=args.max_train_steps * accelerator.num_processes
        if overrode_max_train_steps else args.max_train_steps * accelerator.num_processes,
    )

    # Prepare everything with our `accelerator`.
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )

    # We need to recalculate our total training steps as the size of the training dataloader may have changed.
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / accelerator.gradient_accumulation_steps)
    if overrode_max_train_steps:
        args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    args.num_train_epochs = math.ceil(args.max_train_steps / num_update_steps_per_epoch)

    total_batch_size = (args.per_device_train_batch_size * accelerator.num_processes
                        * accelerator.gradient_accumulation_steps)
    logger.info("***** Running training *****")
    logger.info(f"  Num examples = {len(train_dataset)}")
    logger.info(f"  Num Epochs = {args.num_train_epochs}")
    logger.info(f"  Instantaneous batch size per device = {args.per_device_train_batch_size}")
    logger.info(f"  Total train batch size (w. parallel, distributed & accumulation) = {total_batch_size}")
    logger.info(f"  Gradient Accumulation steps = {accelerator.gradient_accumulation_steps}")
    logger.info(f"  Total optimization steps = {args.max_train_steps}")
    progress_bar = tqdm(range(args.max_train_steps), disable=not accelerator.is_local_main_process)
    completed_steps = 0

    for epoch in range(args.num_train_epochs):
        model.train()
        total_loss = 0.0
        for step, batch in enumerate(train_dataloader):
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                total_loss += loss.detach().float()
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

            # Checks if the accelerator has performed an optimization step behind the scenes
            if accelerator.sync_gradients:
                progress_bar.update(1)
                completed_steps += 1
                if completed_steps % 8 == 0:
                    progress_bar.set_postfix(loss=loss.item())

            if completed_steps >= args.max_train_steps:
                break

        model.eval()
        losses = []
        for step, batch in enumerate(eval_dataloader):
            with torch.no_grad():
                outputs = model(**batch)
            loss = outputs.loss
            losses.append(accelerator.gather_for_metrics(loss.repeat(args.per_device_eval_batch_size)))
        losses = torch.cat(losses)
        try:
            eval_loss = torch.mean(losses)
            perplexity = math.exp(eval_loss)
        except OverflowError:
            perplexity = float("inf")
        logger.info(f"epoch {epoch}: perplexity: {perplexity} eval_loss: {eval_loss}")
        accelerator.print(
            f"run_clm_no_trainer: micro-batch {train_dataloader.total_batch_size} accumulation "
            f"{accelerator.gradient_accumulation_steps} mixed_precision {accelerator.mixed_precision} "
            f"steps {completed_steps} train_loss {total_loss.item() / len(train_dataloader):.3f} "
            f"perplexity {perplexity:.1f}")

    if args.output_dir is not None:
        accelerator.wait_for_everyone()
        unwrapped_model = accelerator.unwrap_model(model)
        unwrapped_model.save_pretrained(args.output_dir, is_main_process=accelerator.is_main_process,
                                        save_function=accelerator.save)


if __name__ == "__main__":
    main()
