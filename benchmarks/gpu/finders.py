"""Run Lightning's or Hugging Face's batch-size finder on GPT-2 small, as its users would.

    python -m benchmarks.gpu.finders lightning --device cuda --out lightning.json
    python -m benchmarks.gpu.finders hf --device cuda --start 256 --out hf.json

Each finder runs in this process (that is how those tools work), in its default precision (fp32) or
in bf16 as an engineer configures it (`--precision bf16`: Lightning's "bf16-mixed", HF's `bf16=True`),
then trains `--fit-steps` steps with the batch it found, the way a user's `fit()`/`train()` would
continue, timing each step with the device synchronised. The JSON says which batch it found, how
long finding took, whether the following training ran or ran out of memory, and its samples/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch
from torch.utils.data import Dataset

from benchmarks.gpu.gpt124m import TOKENS, build_model


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class StepTimer:
    """Timestamps at the end of every training step, device synchronised."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.stamps: list[float] = []

    def tick(self) -> None:
        _sync(self.device)
        self.stamps.append(time.perf_counter())

    def samples_per_s(self, batch: int, skip: int = 2) -> float | None:
        times = [b - a for a, b in zip(self.stamps[skip:], self.stamps[skip + 1:])]
        return batch / statistics.median(times) if times else None


def lightning_finder(device: str, fit_steps: int, mode: str, precision: str = "fp32") -> dict:
    import lightning as L
    from lightning.pytorch.tuner import Tuner
    from torch.utils.data import DataLoader, TensorDataset

    timer = StepTimer(device)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = build_model()
            self.batch_size = 2

        def training_step(self, batch, batch_idx):
            (x,) = batch
            return self.model(input_ids=x, labels=x).loss

        def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
            timer.tick()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=3e-4, weight_decay=0.1)

        def train_dataloader(self):
            return DataLoader(TensorDataset(TOKENS), batch_size=self.batch_size, shuffle=True, drop_last=True)

    module = Module()
    trainer = L.Trainer(accelerator="gpu" if device == "cuda" else "cpu", devices=1, precision="bf16-mixed" if precision == "bf16" else "32-true",
                        max_steps=fit_steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    started = time.perf_counter()
    found = Tuner(trainer).scale_batch_size(module, mode=mode, init_val=2, max_trials=25, steps_per_trial=3)
    find_s = time.perf_counter() - started
    timer.stamps.clear()
    outcome = _fit(lambda: trainer.fit(module))
    return {"tool": f"lightning-{mode}", "batch_size": found, "precision": precision, "find_s": round(find_s, 1),
            **outcome, "samples_per_s": timer.samples_per_s(found) if outcome["fit"] == "ok" else None,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved() if device == "cuda" else None}


class TokenDataset(Dataset):
    def __len__(self) -> int:
        return len(TOKENS)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": TOKENS[i], "labels": TOKENS[i]}


def hf_finder(device: str, fit_steps: int, start: int, precision: str = "fp32") -> dict:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    timer = StepTimer(device)

    class Timing(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            timer.tick()

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, per_device_train_batch_size=start, auto_find_batch_size=True,
            max_steps=fit_steps, report_to="none", save_strategy="no", logging_strategy="no",
            dataloader_drop_last=True, use_cpu=device == "cpu", learning_rate=3e-4, weight_decay=0.1,
            bf16=precision == "bf16",
        )
        trainer = Trainer(model=build_model(), args=args, train_dataset=TokenDataset(), callbacks=[Timing()])
        started = time.perf_counter()
        outcome = _fit(trainer.train)
        wall = time.perf_counter() - started
    found = trainer._train_batch_size  # what auto_find_batch_size settled on
    # The finder and the training are one loop: the steps after the last restart are the training.
    steps = fit_steps + 1
    timer.stamps = timer.stamps[-steps:]
    return {"tool": "hf-auto_find_batch_size", "batch_size": found, "precision": precision, "start": start,
            "find_and_fit_s": round(wall, 1), **outcome,
            "samples_per_s": timer.samples_per_s(found) if outcome["fit"] == "ok" else None,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved() if device == "cuda" else None}


def _fit(train) -> dict:
    try:
        train()
    except torch.OutOfMemoryError as error:
        return {"fit": "oom", "error": str(error)[:300]}
    except RuntimeError as error:
        if "can't allocate memory" in str(error):  # the CPU allocator under a memory limit
            return {"fit": "oom", "error": str(error)[:300]}
        return {"fit": "error", "error": f"{type(error).__name__}: {str(error)[:300]}"}
    return {"fit": "ok"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tool", choices=["lightning", "hf"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--fit-steps", type=int, default=12)
    parser.add_argument("--start", type=int, default=256, help="HF: the batch size auto_find_batch_size starts from")
    parser.add_argument("--mode", default="power", help="Lightning: power or binsearch")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="the precision the finder and its training run in (bf16: as an engineer sets it)")
    parser.add_argument("--memory-limit", default=None,
                        help="CPU: cap this process's memory as autofit caps a probe's (RLIMIT_DATA), e.g. 2GiB")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.memory_limit:
        from autofit.devices import make_backend
        from autofit.export import MemoryBudget
        from autofit.units import parse_size

        make_backend(args.device, 0).apply_memory_limit(MemoryBudget(limit_bytes=parse_size(args.memory_limit)))
    if args.tool == "lightning":
        result = lightning_finder(args.device, args.fit_steps, args.mode, args.precision)
    else:
        result = hf_finder(args.device, args.fit_steps, args.start, args.precision)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
