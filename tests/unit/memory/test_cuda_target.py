"""The memory estimator for a CUDA target, run on the CPU: it counts the memory of the kernels the run
will use there (fused attention without a scores matrix, foreach optimizer steps) and follows a
script's CUDA branches, and its predicted peaks meet the peaks measured on an H100
(benchmarks/gpu/results/)."""
from __future__ import annotations

import json
import os
import re

import pytest

from autofit.config import Config
from autofit.memory import ALLOCATOR_OVERHEAD, CUDA_CONTEXT_BYTES, WhatFits, estimate_memory
from tests.support import CORPUS, REPO

RESULTS = os.path.join(REPO, "benchmarks", "gpu", "results")


@pytest.mark.slow  # two estimator processes of a few seconds each
def test_a_script_that_picks_autocast_by_the_device_type_is_estimated_on_its_cuda_branch(tmp_path):
    script = tmp_path / "branches.py"
    script.write_text(
        "import torch\nfrom contextlib import nullcontext\nfrom autofit import autofit\n\n\n"
        "@autofit(batch_range=(1, 64))\ndef train(run):\n"
        "    device_type = 'cuda' if 'cuda' in str(run.device) else 'cpu'  # nanoGPT's test\n"
        "    ctx = nullcontext() if device_type == 'cpu' else torch.autocast(device_type, dtype=torch.bfloat16)\n"
        "    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).to(run.device)\n"
        "    opt = torch.optim.AdamW(model.parameters(), fused=device_type == 'cuda')\n"
        "    data = [torch.randn(run.batch_size, 256, 1024) for _ in range(4)]\n"
        "    while True:\n"
        "        for x in run.batches(data):\n"
        "            if device_type == 'cuda':\n"
        "                x = x.pin_memory().to(run.device, non_blocking=True)\n"
        "            with ctx:\n                loss = model(x).float().square().mean()\n"
        "            run.backward(loss, opt)\n")
    config = Config(batch_size=64, precision="bf16")
    on_cpu = estimate_memory(str(script), [config]).estimates[config].breakdown
    on_cuda = estimate_memory(str(script), [config], target="cuda").estimates[config].breakdown
    assert on_cuda["parameters"] == on_cpu["parameters"] == 8 * (1024 * 1024 + 1024) * 4
    # Under bf16 autocast each layer keeps its input's bf16 copy (and its output in bf16): less than fp32's.
    assert 0 < on_cuda["activations"] < 0.85 * on_cpu["activations"]  # 0.77 with torch 2.13


@pytest.mark.slow  # three estimator processes of a few seconds each
def test_activation_offload_takes_the_blocks_saved_tensors_off_a_cuda_targets_peak(tmp_path):
    script = tmp_path / "blocks.py"
    script.write_text(
        "import torch\nfrom autofit import autofit\n\n\n"
        "@autofit(batch_range=(1, 4096))\ndef train(run):\n"
        "    blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU())\n"
        "                                  for _ in range(8)])\n"
        "    run.checkpoint(blocks)\n"
        "    model = blocks.to(run.device)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "    data = [torch.randn(run.batch_size, 64) for _ in range(2)]\n"
        "    while True:\n"
        "        for x in run.batches(data):\n"
        "            for block in blocks:\n                x = block(x)\n"
        "            run.backward(x.square().mean(), opt)\n")
    kept, offloaded = Config(batch_size=4096), Config(batch_size=4096, offload_activations=True)
    on_cuda = estimate_memory(str(script), [kept, offloaded], target="cuda").estimates
    saved = 16 * 4096 * 64 * 4  # each block's input and its GELU's, fp32
    assert on_cuda[kept].breakdown["activations"] >= saved
    assert on_cuda[offloaded].breakdown["activations"] <= on_cuda[kept].breakdown["activations"] - 0.75 * saved
    on_cpu = estimate_memory(str(script), [offloaded])
    assert "set offload_activations to false" in on_cpu.unavailable[offloaded]  # the CPU refuses it


def _gpt2_small_peaks() -> list[tuple[Config, int]]:
    """GPT-2 small's configs and their peaks as measured on the H100 (2026-11-25's search)."""
    with open(os.path.join(RESULTS, "2026-11-25-gpt124m.best.json"), encoding="utf-8") as handle:
        best = json.load(handle)
    assert best["device"]["name"] == "NVIDIA H100 80GB HBM3"
    rows = [({**best["config"]}, best["measured"]["peak_bytes"])]
    rows += [(row, row["peak_bytes"]) for row in best["runner_ups"]]
    return [(Config(batch_size=row["batch_size"], precision=row["precision"]), peak) for row, peak in rows]


def _nanogpt_train_peak() -> tuple[Config, int]:
    """nanoGPT's loop (tests/corpus/nanogpt_train.py): the winner and its probe's peak on the H100,
    from the corpus table of 2026-11-25 (MiB)."""
    with open(os.path.join(RESULTS, "2026-11-25-corpus-cuda.log"), encoding="utf-8") as handle:
        table = [line.split("|")[1:-1] for line in handle if line.startswith("|")]
    header = [cell.strip() for cell in table[0]]
    row = next([cell.strip() for cell in cells] for cells in table if cells[0].strip() == "nanogpt_train")
    precision, batch = re.fullmatch(r"(\w+) b=(\d+)", row[header.index("winner")]).groups()
    return Config(batch_size=int(batch), precision=precision), int(row[header.index("measured (probe)")]) * 2**20


@pytest.mark.slow  # GPT-2 small's estimates: about 7 s each on one core
def test_estimates_for_a_cuda_target_meet_the_peaks_measured_on_an_h100():
    pytest.importorskip("transformers")
    measured = {os.path.join(REPO, "benchmarks", "gpu", "gpt124m.py"): _gpt2_small_peaks(),
                os.path.join(CORPUS, "nanogpt_train.py"): [_nanogpt_train_peak()]}
    assert len(measured[os.path.join(REPO, "benchmarks", "gpu", "gpt124m.py")]) >= 4
    for script, peaks in measured.items():
        fits = WhatFits(script, None, on_gpu=True)  # as `autofit estimate --memory` asks
        try:
            fits.fill([config for config, _ in peaks])
            for config, peak in peaks:
                estimate = fits.estimates[_as_estimated(config)]
                assert estimate is not None, (script, config, fits.why_not)
                predicted = fits.peak(estimate)
                assert abs(predicted / peak - 1) <= 0.15, (os.path.basename(script), config, predicted, peak)
        finally:
            fits.close()


def _as_estimated(config: Config) -> Config:
    """fp16 is estimated as bf16 and tf32 as fp32 (the same bytes): the key WhatFits keeps it under."""
    import dataclasses

    return dataclasses.replace(config, precision={"fp16": "bf16", "tf32": "fp32"}.get(config.precision,
                                                                                       config.precision))


@pytest.mark.slow  # an estimator process of a few seconds
def test_a_script_that_calls_the_cuda_api_is_estimated_on_its_cpu_branch_where_there_is_no_gpu(tmp_path):
    import torch

    script = tmp_path / "synchronizes.py"
    script.write_text(
        "import torch\nfrom autofit import autofit\n\n\n@autofit(batch_range=(1, 64))\ndef train(run):\n"
        "    model = torch.nn.Linear(256, 256).to(run.device)\n    opt = torch.optim.AdamW(model.parameters())\n"
        "    while True:\n        for x in run.batches([torch.randn(run.batch_size, 256)] * 4):\n"
        "            if run.device.type == 'cuda':\n                torch.cuda.synchronize()  # timing, as scripts do\n"
        "            run.backward(model(x).square().mean(), opt)\n")
    config = Config(batch_size=64)
    found = estimate_memory(str(script), [config], target="cuda")
    estimate = found.estimates[config]
    assert estimate.complete and estimate.breakdown["parameters"] == (256 * 256 + 256) * 4, found.unavailable
    if not torch.cuda.is_available():
        assert any("estimated on the function's CPU branch" in note for note in estimate.notes), estimate.notes


def _nanogpt_defaults_peaks() -> list[tuple[Config, int]]:
    """nanoGPT's own train.py at its defaults (GPT-2 124M, bf16, fused AdamW, flash SDPA): each probe's
    micro-batch and peak on the H100 (2026-11-27's search)."""
    with open(os.path.join(RESULTS, "2026-11-27-nanogpt-defaults.log"), encoding="utf-8") as handle:
        found = re.findall(r"trial \d+: ok\s+(\w+) b=(\d+) acc=\d+\s.*?peak ([\d.]+) GiB", handle.read())
    return [(Config(batch_size=int(batch), precision=precision), int(float(peak) * 2**30))
            for precision, batch, peak in dict.fromkeys(found)]


@pytest.mark.slow  # GPT-2 small's estimates through nanoGPT's train.py: about 20 s each on one core
def test_nanogpt_train_py_estimated_for_cuda_meets_its_peaks_on_an_h100(tmp_path, monkeypatch):
    """Its CUDA branch (`device_type == 'cuda'`: bf16 autocast, fused AdamW) is what ran there; estimated
    eager at 2 micro-batches a step (the gradients held from the second on, as at its 15), where the H100
    ran it compiled."""
    import shutil

    import numpy as np

    peaks = _nanogpt_defaults_peaks()
    assert len(peaks) >= 2
    shutil.copytree(os.path.join(CORPUS, "nanogpt_repo"), tmp_path, dirs_exist_ok=True)
    os.makedirs(tmp_path / "data" / "openwebtext")
    for split in ("train", "val"):  # random GPT-2 token ids, as the H100's run had
        np.random.default_rng(0).integers(0, 50257, 200_000, dtype=np.uint16).tofile(
            tmp_path / "data" / "openwebtext" / f"{split}.bin")
    monkeypatch.chdir(tmp_path)
    for measured, peak in peaks:
        config = Config(batch_size=measured.batch_size, accumulation_steps=2, precision=measured.precision)
        monkeypatch.setenv("AUTOFIT_SCRIPT_ARGS", json.dumps(
            ["--eval_iters=1", "--compile=False", f"--batch_size={config.batch_size}", "--gradient_accumulation_steps=2"]))
        found = estimate_memory(str(tmp_path / "train.py"), [config], target="cuda", timeout=600)
        estimate = found.estimates[config]
        assert estimate.complete, found.unavailable
        predicted = CUDA_CONTEXT_BYTES + estimate.total_bytes * (1 + ALLOCATOR_OVERHEAD)  # as WhatFits.peak
        assert abs(predicted / peak - 1) <= 0.15, (config, predicted, peak)
