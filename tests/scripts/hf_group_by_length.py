"""A Hugging Face Trainer script that groups by length (`train_sampling_strategy="group_by_length"`), under
AutofitTrainer: a tiny GPT-2 from its config (no download) on generated sequences of varied lengths, padded
per batch by its own collator, which writes each batch's samples and padded length to $BATCHES_OUT. With
$PAD_COLLATOR=1 the collator is a dataclass with `pad_to_multiple_of`, as HF's padding collators are."""
import dataclasses
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from autofit import autofit
from autofit.integrations.hf import AutofitTrainer

LENGTHS = [3, 5, 8, 13, 21, 2, 7, 30, 4, 9, 16, 6, 11, 25, 3, 12] * 4  # 64 samples, longest 30


class Sequences(torch.utils.data.Dataset):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.items = [torch.randint(1, 64, (n,), generator=generator) for n in LENGTHS]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.items[i]}  # HF computes the lengths from input_ids


def pad(features: list[dict], multiple: int = 1) -> dict:
    longest = -(-max(len(f["input_ids"]) for f in features) // multiple) * multiple
    ids = torch.zeros(len(features), longest, dtype=torch.long)
    mask = torch.zeros(len(features), longest, dtype=torch.long)
    for row, f in enumerate(features):
        ids[row, :len(f["input_ids"])], mask[row, :len(f["input_ids"])] = f["input_ids"], 1
    if os.environ.get("BATCHES_OUT"):
        with open(os.environ["BATCHES_OUT"], "a") as out:
            out.write(f"{len(features)} {longest}\n")
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


@dataclasses.dataclass
class Pad:
    """A padding collator as HF's are: a dataclass with `pad_to_multiple_of`."""

    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict]) -> dict:
        return pad(features, self.pad_to_multiple_of or 1)




@autofit
def train(run):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2))
    args = TrainingArguments(output_dir=os.environ.get("HF_OUT", "hf_out"), per_device_train_batch_size=4,
                             train_sampling_strategy="group_by_length", num_train_epochs=1, learning_rate=1e-3,
                             save_strategy="no", report_to="none", logging_strategy="no", seed=0,
                             remove_unused_columns=False, disable_tqdm=True)
    trainer = AutofitTrainer(run, model=model, args=args, train_dataset=Sequences(), data_collator=Pad() if os.environ.get("PAD_COLLATOR") == "1" else pad)
    result = trainer.train()
    print(f"hf_group_by_length: steps {result.global_step}", flush=True)


if __name__ == "__main__":
    train()
