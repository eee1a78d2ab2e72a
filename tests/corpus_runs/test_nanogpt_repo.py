"""nanoGPT's own train.py, unmodified but for four lines after its configurator (tests/corpus/nanogpt_repo:
`autofit.start`, the micro-batch and accumulation, the dtype and the device from `run`), with its model.py
and configurator.py: searched and estimated on the CPU with its own arguments after `--`, then run normally with the
config found. Its data is a small character corpus in data/shakespeare_char's format, made here."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import REPO, autofit_cli
from tests.support.nanogpt import nanogpt_folder

ARGS = ["--dataset=shakespeare_char", "--device=cpu", "--compile=False", "--eval_iters=2", "--eval_interval=100000",
        "--log_interval=1", "--block_size=64", "--batch_size=12", "--gradient_accumulation_steps=1", "--n_layer=2",
        "--n_head=2", "--n_embd=64", "--max_iters=400", "--lr_decay_iters=400", "--dropout=0.0"]


@pytest.mark.slow
def test_nanogpt_train_py_searched_then_run_with_the_config_found(tmp_path):
    nanogpt_folder(tmp_path)
    searched = autofit_cli("search", "train.py", "--trials", "3", "--budget", "3m", "--precision", "fp32", "--memory-limit", "4GiB",
                           "--batch-range", "1:24", "--json", "--", *ARGS, cwd=tmp_path, timeout=900)
    assert searched.returncode == 0, searched.stderr[-3000:]
    document = json.loads(searched.stdout)["best"]
    assert document["script"]["args"] == ARGS
    config = document["config"]
    assert config["batch_size"] * config["accumulation_steps"] == 12  # nanoGPT's batch_size x accumulation
    estimated = autofit_cli("estimate", "train.py", "--batch-range", "1:24", "--precision", "fp32", "--", *ARGS,
                            cwd=tmp_path, timeout=600)
    assert estimated.returncode == 0, estimated.stderr[-3000:]
    # Its eval prints a loss as f"{loss:.4f}": the fake tensors format as numbers, so the estimate follows
    # the script past its evaluation into two training steps and predicts its configs (no partial line)
    assert "memory estimator:" not in estimated.stdout and "activations not predicted" not in estimated.stdout
    assert "PREDICTED from two steps on fake tensors" in estimated.stdout and " fp32 b=12 " in estimated.stdout
    run = subprocess.run([sys.executable, "train.py", *ARGS[:-3], "--max_iters=20", "--lr_decay_iters=20",
                          "--dropout=0.0"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "running train.py with the best config from" in run.stderr
    assert "are not those searched" in run.stderr  # --max_iters=20 is not what was searched
    label = f"b={config['batch_size']}" + (f" acc={config['accumulation_steps']}" if config["accumulation_steps"] > 1 else "")
    # nanoGPT's loop steps from iteration 0 to max_iters inclusive: 21 optimizer steps, each followed
    assert f"autofit: trained 21 optimizer steps with fp32 {label}" in run.stderr
    assert "iter 20: loss" in run.stdout  # nanoGPT's own log, to its last iteration


@pytest.mark.slow  # an estimator process of a few seconds
def test_nanogpt_train_py_is_estimated_with_its_batches_windows(tmp_path, monkeypatch):
    """Its get_batch slices `data[i:i + block_size]` at random starts read from fake tensors: with each
    read alone as 1, every window was empty, and the estimate had no activations at any batch."""
    from autofit.config import Config
    from autofit.memory import estimate_memory

    script = nanogpt_folder(tmp_path)
    monkeypatch.setenv("AUTOFIT_SCRIPT_ARGS", json.dumps(ARGS))
    monkeypatch.chdir(tmp_path)
    small, large = Config(batch_size=4, accumulation_steps=3), Config(batch_size=12)
    found = estimate_memory(script, [small, large])
    assert not found.unavailable, found.unavailable
    tokens = [found.estimates[c].breakdown["activations"] / c.batch_size for c in (small, large)]
    # nanoGPT's own logits alone: 64 tokens x its 65-character vocabulary x 4 bytes a sample
    assert all(per_sample > 64 * 65 * 4 for per_sample in tokens), tokens
