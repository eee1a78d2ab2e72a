"""A causal-LM fine-tune in the style of Hugging Face's examples/pytorch/language-modeling/run_clm.py:
a model from its config (GPT2Config; no download), texts tokenized and grouped into blocks whose
labels are their input ids (group_texts), `default_data_collator`, TrainingArguments with a micro-batch,
gradient accumulation, a warm-up and cosine schedule and logging, then `trainer.train()`,
`save_model()`, the train metrics logged and saved, and an evaluation with its perplexity.

Changed for autofit (marked `# autofit`), as README "A Hugging Face Trainer script, searched as it
is" says: the two imports, the decorator (the global batch the TrainingArguments train, 8 x 2) on a
function around the Trainer, and `AutofitTrainer(run, ...)` where the script built `Trainer(...)`.
Nothing else: the script's own per_device_train_batch_size, gradient_accumulation_steps and precision
stand until a search exports a config, which AutofitTrainer then applies to the TrainingArguments.

"Texts" are seeded random token ids (no tokenizer download).
"""

from __future__ import annotations

import math
import os
from itertools import chain

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments, default_data_collator, set_seed

from autofit import autofit  # autofit
from autofit.integrations.hf import AutofitTrainer  # autofit

BLOCK_SIZE = 64
VOCAB = 1024


def tokenized_texts(n: int, seed: int) -> list[list[int]]:
    """Stands in for raw_datasets.map(tokenize_function): documents of varying length."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(20, 200, (n,), generator=generator)
    return [torch.randint(0, VOCAB, (int(length),), generator=generator).tolist() for length in lengths]


def group_texts(examples: dict[str, list[list[int]]]) -> dict[str, list[list[int]]]:
    """run_clm's group_texts: concatenate all texts and split them into chunks of BLOCK_SIZE."""
    concatenated = {k: list(chain(*examples[k])) for k in examples}
    total_length = len(concatenated[next(iter(examples))])
    total_length = (total_length // BLOCK_SIZE) * BLOCK_SIZE
    result = {k: [t[i:i + BLOCK_SIZE] for i in range(0, total_length, BLOCK_SIZE)] for k, t in concatenated.items()}
    result["labels"] = result["input_ids"].copy()
    return result


class Blocks(torch.utils.data.Dataset):
    """The grouped dataset (a datasets.Dataset in run_clm), as rows of dicts."""

    def __init__(self, grouped: dict[str, list[list[int]]]) -> None:
        self.rows = [dict(zip(grouped, values)) for values in zip(*grouped.values())]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


train_dataset = Blocks(group_texts({"input_ids": tokenized_texts(300, seed=0)}))
eval_dataset = Blocks(group_texts({"input_ids": tokenized_texts(30, seed=1)}))


@autofit(global_batch=16)  # autofit: per_device_train_batch_size x gradient_accumulation_steps below
def main(run):  # autofit: run_clm's main(), with the Trainer in it
    training_args = TrainingArguments(
        output_dir=os.environ.get("HF_OUT", "clm_out"),
        per_device_train_batch_size=8, per_device_eval_batch_size=8, gradient_accumulation_steps=2,
        learning_rate=5e-4, warmup_steps=2, lr_scheduler_type="cosine", weight_decay=0.01, num_train_epochs=1,
        logging_steps=10, save_strategy="no", report_to="none", seed=42,
    )
    set_seed(training_args.seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=BLOCK_SIZE, n_embd=64, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    trainer = AutofitTrainer(  # autofit: was Trainer(
        run,  # autofit
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=default_data_collator,
    )
    train_result = trainer.train()
    trainer.save_model()  # Saves the tokenizer too for easy upload
    metrics = train_result.metrics
    metrics["train_samples"] = len(train_dataset)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    metrics = trainer.evaluate()
    metrics["perplexity"] = math.exp(metrics["eval_loss"])
    trainer.log_metrics("eval", metrics)
    used = trainer.args
    print(f"hf_trainer_clm: per_device {used.per_device_train_batch_size} accumulation "
          f"{used.gradient_accumulation_steps} steps {train_result.global_step} "
          f"perplexity {metrics['perplexity']:.1f}", flush=True)


if __name__ == "__main__":
    main()
