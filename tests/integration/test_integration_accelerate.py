"""Accelerate's no_trainer loop searched as it is (autofit.integrations.accelerate).

In-process, fast: the config reaches the Accelerator and the training DataLoader, the user's own
settings stand without a search, and an OOM in a forward or a backward inside the script's own loop is
redone in pieces with the global batch kept, training exactly as the lower micro-batch would.
Real, `frameworks`: tests/corpus/accelerate_clm_no_trainer.py (written after HF's
run_clm_no_trainer.py) probed, searched under a memory limit and run with its answer."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from autofit.config import Config
from autofit.errors import UsageError
from autofit.runtime import ProbeFinished, Run
from tests.support import CORPUS, REPO, autofit_cli, probed_configs, refused_by_the_allocator

pytest.importorskip("accelerate", reason="the hf extra: pip install -e '.[hf]'")
from autofit.integrations.accelerate import AutofitAccelerator, accelerator_settings  # noqa: E402

ACCELERATE_CLM = os.path.join(CORPUS, "accelerate_clm_no_trainer.py")


class _FailsInBackward(torch.autograd.Function):
    """Identity forward; its backward runs out of memory above `fits` samples."""

    @staticmethod
    def forward(ctx, x, fits):
        ctx.fits = fits
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.fits is not None and grad.shape[0] > ctx.fits:
            raise torch.OutOfMemoryError("out of memory in backward (test)")
        return grad, None


class Tiny(torch.nn.Module):
    """Two repeated blocks; returns its loss as HF models do. `fits_forward` / `fits_backward`: the
    largest batch that fits in that phase (None: any)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))
        self.fits_forward: int | None = None
        self.fits_backward: int | None = None

    def forward(self, x, y):
        if self.fits_forward is not None and x.shape[0] > self.fits_forward:
            raise torch.OutOfMemoryError("out of memory in forward (test)")
        h = x
        for block in self.blocks:
            h = torch.tanh(block(h))
        h = _FailsInBackward.apply(h, self.fits_backward)
        return {"loss": (h - y).pow(2).mean()}


def _loop(run: Run, *, grows: str | None = None, loader_batch: int = 4, accumulation: int = 2,
          own_loss: bool = False) -> dict:
    """A no_trainer loop over 32 samples; from the second optimizer step on, batches above 2 samples
    run out of memory in the phase `grows` names. `own_loss`: the loop scales the model's loss itself."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 8), torch.randn(32, 8))
    accelerator = AutofitAccelerator(run, gradient_accumulation_steps=accumulation)
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(data, batch_size=loader_batch)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    batches, steps = [], 0
    for x, y in loader:
        batches.append(len(x))
        with accelerator.accumulate(model):
            loss = model(x, y)["loss"]
            if own_loss:
                loss = loss * 1.0
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            steps += 1
            if steps == 1 and grows:
                setattr(model, f"fits_{grows}", 2)
    return {"weights": {k: v.clone() for k, v in model.state_dict().items()}, "batches": batches, "steps": steps,
            "accelerator": accelerator}


def test_the_config_reaches_the_accelerator_and_the_training_loader():
    settings = accelerator_settings(Run(Config(batch_size=8, precision="bf16", accumulation_steps=2)), {"mixed_precision": "no"})
    assert settings["mixed_precision"] == "bf16" and settings["gradient_accumulation_steps"] == 2
    assert settings["cpu"] is True
    assert accelerator_settings(Run(Config(batch_size=8, precision="tf32")), {})["mixed_precision"] == "no"  # TF32: the run's scope
    run = Run(Config(batch_size=2, accumulation_steps=4))
    with run.control.active():
        done = _loop(run)
    assert done["batches"] == [2] * 16 and done["steps"] == 4
    assert done["accelerator"].gradient_accumulation_steps == 4
    assert run.optimizer_steps == 4 and run.control.knobs.checkpoint_blocks == 2


def test_a_probe_counts_the_loops_optimizer_steps_and_never_runs_out_of_data():
    """32 samples at 4 x 2 give 4 optimizer steps an epoch; a probe of 2 + 5 steps ends by itself
    within the script's one pass over its loader (ProbeFinished), its loader starting again."""
    run = Run(Config(batch_size=4, accumulation_steps=2), probing=True, warmup_steps=2, measured_steps=5)
    with run.control.active(), pytest.raises(ProbeFinished):
        _loop(run)
    assert run.optimizer_steps == 7 and run.control.clock.measured_samples == 5 * 8
    noted = {k: v for k, v in run.control.knobs.to_dict().items() if v not in (None, False)}
    assert noted == {"autocast": True, "backward": True, "checkpoint_blocks": 2, "batches": True}


def test_without_a_search_the_users_own_settings_stand():
    run = Run(Config(batch_size=1), defaults=True)
    with run.control.active():
        done = _loop(run)
    assert done["batches"] == [4] * 8 and done["steps"] == 4
    assert run.config == Config(batch_size=4, precision="fp32", accumulation_steps=2)


def test_a_config_that_would_change_the_global_batch_is_refused():
    with pytest.raises(UsageError, match="asks for a global batch of 8 \\(4 x 2 accumulation steps\\)"):
        _loop(Run(Config(batch_size=4)))


def test_a_probe_that_prices_a_long_accumulation_keeps_the_scripts_global_batch():
    """A probe of b=1 acc=16 runs 4 micro-batches a step and prices the 16 (PROBE_ACCUMULATION): the script's
    global batch (its loader's 4 x its own 4 accumulation steps) is the priced config's, not the one that ran
    (a held-out Accelerate script's every probe was refused as "global batch 4, not 16")."""
    run = Run(Config(batch_size=1, accumulation_steps=16), probing=True, warmup_steps=1, measured_steps=4, probe_accumulation=4)
    with run.control.active(), pytest.raises(ProbeFinished):
        _loop(run, accumulation=4)
    assert run.config.accumulation_steps == 4 and run.control.priced_config.accumulation_steps == 16


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_an_oom_in_the_loop_is_redone_in_pieces_and_trains_as_the_lower_micro_batch(phase, capsys):
    grown = Run(Config(batch_size=4, accumulation_steps=2), recover_oom=True)
    with grown.control.active():
        done = _loop(grown, grows=phase)
    assert [item.where for item in grown.lowerings] == [phase]
    assert grown.lowerings[0].step == 2 and grown.config == Config(batch_size=2, accumulation_steps=4)
    assert "global batch 8 unchanged" in capsys.readouterr().err
    assert done["steps"] == 4 and grown.optimizer_steps == 4
    assert done["batches"] == [4] * 8  # the script's loader keeps its batches; autofit cuts them

    lower = Run(Config(batch_size=2, accumulation_steps=4))
    with lower.control.active():
        reference = _loop(lower)
    for key, value in reference["weights"].items():
        torch.testing.assert_close(done["weights"][key], value, rtol=1e-6, atol=1e-6)


def test_a_loop_that_computes_its_own_loss_is_told_why_its_oom_cannot_be_redone():
    run = Run(Config(batch_size=4, accumulation_steps=2), recover_oom=True)
    with run.control.active(), pytest.raises(UsageError, match="this loop computes its own"):
        _loop(run, grows="forward", own_loss=True)


def test_without_recovery_the_oom_reaches_the_script():
    run = Run(Config(batch_size=4, accumulation_steps=2), recover_oom=False)
    with run.control.active(), pytest.raises(torch.OutOfMemoryError):
        _loop(run, grows="forward")


# --- the corpus script, for real -------------------------------------------------------------------
#: Measured on this machine (block 64, probe peaks with the process's baseline of ~330 MiB):
#: b=4 acc=4 404 MiB, b=8 acc=2 444 MiB, b=16 519 MiB, b=16 with 4 checkpointed blocks 446 MiB.
LIMIT = "480MiB"


@pytest.mark.frameworks
def test_the_corpus_script_is_probed_in_the_worker(tmp_path):
    probed = autofit_cli("probe", ACCELERATE_CLM, "--device", "cpu", "--batch-size", "16", "--json", cwd=tmp_path)
    assert probed.returncode == 0, probed.stderr[-3000:]
    result = json.loads(probed.stdout)["result"]
    assert result["status"] == "ok" and result["measured_steps"] >= 5
    assert result["knobs"]["checkpoint_blocks"] == 4  # GPT-2's `h`, found by AutofitAccelerator


@pytest.mark.frameworks
def test_the_corpus_script_is_searched_under_a_limit_and_runs_with_the_answer(tmp_path):
    best = tmp_path / "clm.best.json"
    # A long budget and probe timeout: on a shared 2-core machine one probe of this GPT-2 took 45 s.
    searched = autofit_cli("search", ACCELERATE_CLM, "--device", "cpu", "--memory-limit", LIMIT, "--headroom", "0",
                           "--trials", "3", "--budget", "180s", "--probe-timeout", "150s", "--storage", f"sqlite:///{tmp_path}/clm.db", "--out", str(best),
                           cwd=tmp_path, timeout=600)
    assert searched.returncode == 0, searched.stderr[-3000:]
    config = Config.from_dict(json.loads(best.read_text())["config"])
    assert config.global_batch == 16  # the script's own 4 x 4, held by @autofit(global_batch=16)
    probes = probed_configs(searched.stderr)
    assert probes and all(batch * accumulation == 16 for _, batch, accumulation in probes)
    assert all(status in ("ok", "oom") for status, _, _ in probes)
    # fp32 b=16 without checkpointing does not fit (519 MiB); bf16 may, on a CPU with fast bf16.
    assert config.precision != "fp32" or config.batch_size < 16 or config.checkpoint_segments > 0

    ran = subprocess.run([sys.executable, ACCELERATE_CLM], env={**os.environ, "PYTHONPATH": REPO, "AUTOFIT_CONFIG": str(best)},
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    mixed = {"fp32": "no", "tf32": "no"}.get(config.precision, config.precision)
    assert (f"micro-batch {config.batch_size} accumulation {config.accumulation_steps} mixed_precision {mixed} "
            f"steps 16") in ran.stdout  # 256 samples / 16 per step
    assert f"trained 16 optimizer steps with {config.label()}" in ran.stderr


@pytest.mark.frameworks
def test_the_corpus_scripts_step_runs_out_of_memory_above_the_limit(tmp_path):
    # Two intra-op threads, as it was measured (peak 550 MiB at batch 16 with a roomy limit; on one thread,
    # without the second thread's buffers, 500 MiB, which the cap's reclaim can squeeze under 480 MiB).
    probed = autofit_cli("probe", ACCELERATE_CLM, "--device", "cpu", "--memory-limit", LIMIT, "--batch-size", "16",
                         "--json", cwd=tmp_path, env={"OMP_NUM_THREADS": "2"})
    assert probed.returncode == 1 and probed.stdout.strip(), probed.stderr[-3000:]  # the probe's record, not an error
    result = json.loads(probed.stdout)["result"]
    assert result["status"] == "oom" and refused_by_the_allocator(result["error_message"])


@pytest.mark.frameworks
def test_the_corpus_scripts_estimate_holds_its_gradients_where_the_loop_does():
    """Through AutofitAccelerator's prepared optimizer, every trainable parameter's gradient is filed as
    one: accumulating (acc=2), the first micro-batch's gradients are held through the second's forward,
    where the peak is; without accumulation the peak comes before the step's gradients exist (the last
    step's were freed by `optimizer.zero_grad()`, set_to_none as Accelerate calls it)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from autofit.memory import estimate_memory

    accumulating, plain = Config(batch_size=8, accumulation_steps=2), Config(batch_size=16)
    found = estimate_memory(ACCELERATE_CLM, [accumulating, plain])
    assert found.error is None and not found.unavailable, found.unavailable
    model = GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=64, n_embd=128, n_layer=4, n_head=4))
    trainable = sum(p.numel() * p.element_size() for p in model.parameters())  # the tied head once
    held = found.estimates[accumulating].breakdown
    assert held["gradients"] == trainable and held["parameters"] >= trainable
    assert found.estimates[plain].breakdown["gradients"] < trainable / 10


# --- token batches (run.token_batches) through prepare() ---------------------------------------------
LENGTHS = [3, 5, 8, 13, 21, 2, 7, 30, 4, 9, 16, 6, 11, 25, 3, 12] * 2  # 32 samples, longest 30


class TinyLM(torch.nn.Module):
    """Embedding, one block, a head; returns its loss over the real tokens, as HF models do."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(7, 8)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8)])
        self.head = torch.nn.Linear(8, 7)

    def forward(self, x, y):
        logits = self.head(torch.tanh(self.blocks[0](self.embed(x))))
        return {"loss": torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)}


def _token_loop(run: Run, shapes: list[tuple[int, int, int]]) -> None:
    """A no_trainer loop over run.token_batches handed to prepare(), noting the samples, padded length and
    real tokens of each batch in `shapes`."""
    from tests.support.sequences import Sequences, collate

    torch.manual_seed(0)
    loader = run.token_batches(Sequences(LENGTHS), LENGTHS, collate_fn=collate)
    accelerator = AutofitAccelerator(run)
    model = TinyLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(10**6 if run.probing else 1):
        loader.set_epoch(epoch)
        for x, y in loader:
            shapes.append((*x.shape, int((y != -100).sum())))
            with accelerator.accumulate(model):
                accelerator.backward(model(x, y)["loss"])
                optimizer.step()
                optimizer.zero_grad()


@pytest.mark.frameworks
def test_token_batches_handed_to_prepare_are_probed_by_tokens():
    """The probe climbs max_tokens (the longest sample noted), its batches stay within the cap, the batch of
    the longest sample comes first, and its steps count their real tokens."""
    run = Run(Config(batch_size=64, max_tokens=64), probing=True, warmup_steps=2, measured_steps=30)
    shapes: list = []
    with run.control.active(), pytest.raises(ProbeFinished):
        _token_loop(run, shapes)
    assert run.control.knobs.longest_sample == 30 and "max_tokens" in run.control.reads
    assert shapes[0][:2] == (2, 30)  # the longest sample's batch first: the probe's peak is the data's worst
    assert all(samples * longest <= 64 for samples, longest, _ in shapes)
    assert len(shapes) == 32 > len(run.token_loader)  # the probe's loader started again at its end
    assert run.control.clock.measured_tokens == sum(real for _, _, real in shapes[2:])  # the measured steps' real tokens


@pytest.mark.frameworks
def test_a_normal_run_with_token_batches_trains_each_sample_once_within_the_cap():
    run = Run(Config(batch_size=64, max_tokens=64))
    shapes: list = []
    with run.control.active():
        _token_loop(run, shapes)
    assert all(samples * longest <= 64 for samples, longest, _ in shapes)
    assert sum(samples for samples, _, _ in shapes) == len(LENGTHS) and run.optimizer_steps == len(shapes)


@pytest.mark.frameworks
def test_prepare_across_processes_keeps_every_ranks_token_batches():
    """Accelerate wraps a batch sampler in a BatchSamplerShard across processes; token batches are dealt to
    the ranks already: each rank keeps its own (as many as the other's), and no sample is dropped."""
    from accelerate.data_loader import prepare_data_loader
    from torch.utils.data import DataLoader

    from autofit.integrations.accelerate import CountedTokenBatches, unshard_token_batches
    from autofit.runtime import TokenBatchSampler
    from tests.support.sequences import Sequences, collate

    def rank_batches(rank: int, *, unshard: bool) -> list[int]:
        sampler = CountedTokenBatches(TokenBatchSampler(LENGTHS, 64, rank=rank, world_size=2))
        loader = DataLoader(Sequences(LENGTHS), batch_sampler=sampler, collate_fn=collate)
        prepared = prepare_data_loader(loader, num_processes=2, process_index=rank, put_on_device=False)
        if unshard:
            unshard_token_batches(prepared)
        return [samples for samples, _ in (tuple(x.shape) for x, _ in prepared)]

    mine = [TokenBatchSampler(LENGTHS, 64, rank=rank, world_size=2) for rank in (0, 1)]
    kept = [rank_batches(rank, unshard=True) for rank in (0, 1)]
    assert kept == [[len(b) for b in sampler] for sampler in mine] and len(kept[0]) == len(kept[1])
    assert sum(sum(batches) for batches in kept) >= len(LENGTHS)
    resharded = [rank_batches(rank, unshard=False) for rank in (0, 1)]
    assert sum(sum(batches) for batches in resharded) < len(LENGTHS)  # what the fix prevents: half of each dropped
