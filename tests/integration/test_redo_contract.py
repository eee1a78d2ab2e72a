"""The OOM redo's contract, one scenario through all five entry points: a plain `run.batches` loop,
the decorator, the HF Trainer, Lightning and Accelerate.

The scenario: 32 samples, a global batch of 8 (micro-batch 4, accumulation 2), 4 optimizer steps; from
the second step on, a forward over more than 2 samples runs out of memory. Every entry point must go
on with micro-batch 2 and accumulation 4 (one lowering, in the forward of step 2, on the run's one
StepRedo), train every step, and end with the weights of a run that used micro-batch 2 from the start.
The HF Trainer and Lightning entries import their framework: they run in the `frameworks` tier."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from autofit import autofit
from autofit.config import Config
from autofit.export import BestConfig, write_best
from autofit.runtime import Run

SAMPLES, GLOBAL, FITS = 32, 8, 2
GROWN, LOWER = Config(batch_size=4, accumulation_steps=2), Config(batch_size=2, accumulation_steps=4)


def _data() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(SAMPLES, 8, generator=generator), torch.randn(SAMPLES, 8, generator=generator))


class Tiny(torch.nn.Module):
    """Returns its loss as HF models do; from the run's second optimizer step on, a forward over more
    than FITS samples runs out of memory (only in a run that grows: `grows`)."""

    def __init__(self, run: Run, grows: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))
        self.run, self.grows = run, grows

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict:
        if self.grows and self.training and self.run.optimizer_steps >= 1 and x.shape[0] > FITS:
            raise torch.OutOfMemoryError("out of memory in forward (test)")
        h = x
        for block in self.blocks:
            h = torch.tanh(block(h))
        return {"loss": (h - labels).pow(2).mean()}


def _weights(model: torch.nn.Module) -> dict:
    return {key: value.detach().clone() for key, value in model.state_dict().items() if "blocks" in key}


# --- the five entry points: each trains the scenario and returns (weights, the run) -------------------
def _plain(config: Config, grows: bool, tmp_path) -> tuple[dict, Run]:
    run = Run(config, recover_oom=True)
    with run.control.active():
        _loop(run, grows)
    return run.last_weights, run


def _loop(run: Run, grows: bool) -> None:
    model = Tiny(run, grows)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in run.batches(DataLoader(_data(), batch_size=run.batch_size)):
        with run.autocast():
            loss = model(x, y)["loss"]
        run.backward(loss, optimizer)
    run.last_weights = _weights(model)


def _decorator(config: Config, grows: bool, tmp_path) -> tuple[dict, Run]:
    best = tmp_path / f"{config.batch_size}.best.json"
    write_best(str(best), BestConfig(config=config, device={"type": "cpu"}))
    environment = {"AUTOFIT_CONFIG": str(best), "AUTOFIT_DEVICE": "cpu"}
    saved = {key: os.environ.get(key) for key in (*environment, "AUTOFIT_MEMORY_LIMIT", "AUTOFIT_OOM_RECOVERY")}
    os.environ.update(environment)
    for key in ("AUTOFIT_MEMORY_LIMIT", "AUTOFIT_OOM_RECOVERY"):
        os.environ.pop(key, None)

    @autofit(global_batch=GLOBAL)
    def train(run):
        _loop(run, grows)
        return run

    try:
        run = train()
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    return run.last_weights, run


def _accelerate(config: Config, grows: bool, tmp_path) -> tuple[dict, Run]:
    from autofit.integrations.accelerate import AutofitAccelerator

    run = Run(config, recover_oom=True)
    with run.control.active():
        accelerator = AutofitAccelerator(run, gradient_accumulation_steps=GROWN.accumulation_steps)
        model = Tiny(run, grows)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(_data(), batch_size=GROWN.batch_size)  # the script's: rebatched to the config
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(model(x, y)["loss"])
                optimizer.step()
                optimizer.zero_grad()
    return _weights(model), run


class _Samples(IterableDataset):
    """The scenario's samples in order, as dicts (the HF Trainer's collation)."""

    def __iter__(self):
        for x, y in _data():
            yield {"x": x, "labels": y}


def _hf(config: Config, grows: bool, tmp_path) -> tuple[dict, Run]:
    from transformers import TrainingArguments

    from autofit.integrations.hf import AutofitTrainer

    run = Run(config, recover_oom=True)
    model = Tiny(run, grows)
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), per_device_train_batch_size=GROWN.batch_size,
                             gradient_accumulation_steps=GROWN.accumulation_steps, learning_rate=0.1, optim="sgd",
                             lr_scheduler_type="constant", max_steps=SAMPLES // GLOBAL, weight_decay=0.0,
                             save_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
                             dataloader_num_workers=0, seed=0)
    with run.control.active():
        AutofitTrainer(run, model=model, args=args, train_dataset=_Samples(), checkpoint_blocks=[]).train()
    return _weights(model), run


def _lightning(config: Config, grows: bool, tmp_path) -> tuple[dict, Run]:
    import lightning.pytorch as pl

    from autofit.integrations.lightning import AutofitLightningTrainer

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = Tiny(run, grows)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return self.model(x, y)["loss"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    run = Run(config, recover_oom=True)
    module = Module()
    with run.control.active():
        trainer = AutofitLightningTrainer(run, max_epochs=1, logger=False, enable_checkpointing=False,
                                          enable_progress_bar=False, enable_model_summary=False,
                                          default_root_dir=str(tmp_path), checkpoint_blocks=[])
        trainer.fit(module, DataLoader(_data(), batch_size=run.batch_size))
    return _weights(module.model), run


ENTRY_POINTS = [
    pytest.param(_plain, id="plain"),
    pytest.param(_decorator, id="decorator"),
    pytest.param(_accelerate, id="accelerate"),
    pytest.param(_hf, id="hf", marks=pytest.mark.frameworks),
    pytest.param(_lightning, id="lightning", marks=pytest.mark.frameworks),
]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_an_oom_mid_run_is_redone_at_a_lower_micro_batch_and_trains_as_it_would(entry, tmp_path, capsys):
    module = {"_accelerate": "accelerate", "_hf": "transformers", "_lightning": "lightning"}.get(entry.__name__)
    if module:
        pytest.importorskip(module)
    grown_weights, grown = entry(GROWN, True, tmp_path)
    assert [(item.step, item.where, item.before, item.after) for item in grown.control.redo.lowerings] == [
        (2, "forward", GROWN, LOWER)]
    assert grown.lowerings is grown.control.redo.lowerings and grown.config == LOWER
    assert grown.optimizer_steps == SAMPLES // GLOBAL
    assert f"global batch {GLOBAL} unchanged" in capsys.readouterr().err

    lower_weights, lower = entry(LOWER, False, tmp_path)
    assert lower.lowerings == [] and lower.optimizer_steps == SAMPLES // GLOBAL
    for key, value in lower_weights.items():
        torch.testing.assert_close(grown_weights[key], value, rtol=1e-5, atol=1e-6)
