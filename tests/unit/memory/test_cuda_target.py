"""The memory estimator for a CUDA target, run on the CPU: it counts the memory of the kernels the run
will use there (fused attention without a scores matrix, foreach optimizer steps, CUDA autocast's float32
ops) and follows a script's CUDA branches, and its one-trace predictions meet the peaks measured on an H100
and an H200 within 10% (benchmarks/gpu/results/)."""
from __future__ import annotations

import json
import os
import re

import pytest

from autofit.config import Config
from autofit.memory import Estimator, StoredEstimates, estimate_memory
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


def _one_trace(script: str, configs: list[Config], timeout: float = 900) -> dict[Config, float]:
    """Each config's peak as a search on a GPU predicts it before any probe: the one-trace estimate (its
    program traced at two micro-batches, the config arithmetic over them) as the planner's raw prediction,
    the CUDA context's prior and the tensors at the caching allocator's typical factor
    (`MemoryPrediction.raw_peak`: 768 MiB + 1.1 x tensors)."""
    with Estimator(script, target="cuda", beside_probes=False) as estimator:
        found = estimator.estimate(configs, timeout=timeout, traced=True)
    assert all(e.complete for e in found.estimates.values()) and not found.unavailable, found.unavailable
    stored = StoredEstimates({c: dict(e.breakdown) for c, e in found.estimates.items()}, None, 0.0, None, len(configs))
    prediction = stored.prediction("cuda")
    return {config: prediction.raw_peak(config) for config in configs}


def _within_ten_percent(predicted: dict[Config, float], measured: list[tuple[Config, int]], where: str) -> None:
    errors = {config.label(): round(predicted[config] / peak - 1, 3) for config, peak in measured}
    assert all(abs(error) <= 0.10 for error in errors.values()), (where, errors)


# Like with like: a probe's peak on CUDA is the caching allocator's reserved memory at its most
# (`torch.cuda.max_memory_reserved`) plus what the process holds outside it (the CUDA context, cuBLAS's
# workspaces: autofit.devices' cuda backend), read by NVML; the prediction is the tensors the estimate counts
# (allocated bytes) times the allocator's typical factor, plus the context's prior.

@pytest.mark.slow  # GPT-2 small's two traces and nanoGPT's loop's: about 20 s on two cores
def test_one_trace_meets_the_peaks_measured_on_an_h100_within_ten_percent():
    """GPT-2 small (benchmarks/gpu/gpt124m.py) at bf16 and fp16 b=16/32/48 (2026-11-25's search,
    benchmarks/gpu/results/2026-11-25-gpt124m.best.json) and nanoGPT's loop (the corpus table of
    2026-11-25-corpus-cuda.log), each config of a script from one estimator's traces."""
    pytest.importorskip("transformers")
    measured = {os.path.join(REPO, "benchmarks", "gpu", "gpt124m.py"): _gpt2_small_peaks(),
                os.path.join(CORPUS, "nanogpt_train.py"): [_nanogpt_train_peak()]}
    assert len(measured[os.path.join(REPO, "benchmarks", "gpu", "gpt124m.py")]) >= 4
    for script, peaks in measured.items():
        _within_ten_percent(_one_trace(script, [config for config, _ in peaks]), peaks, os.path.basename(script))


#: GPT-2 medium (benchmarks/gpu/gpt124m.py at GPT124M_LAYERS=24 GPT124M_WIDTH=1024 GPT124M_SAMPLES=1024) on an
#: NVIDIA H200 under a 16 GiB limit, the peaks its probes measured (benchmarks/gpu/results/
#: 2026-12-04-h200-features.md, the 2-minute memory search: trials 1, 2, 3 and 6).
H200_GPT2_MEDIUM = ((Config(batch_size=1, precision="bf16"), 8.20), (Config(batch_size=2, precision="bf16"), 10.88),
                    (Config(batch_size=3, precision="bf16"), 13.66),
                    (Config(batch_size=4, precision="bf16", checkpoint_segments=12, checkpoint_policy="selective"), 13.43))
#: ... and the configs that ran out of memory there (usable 14.40 GiB): the pilot, and b=4 with 6 segments.
H200_GPT2_MEDIUM_OOM = (Config(batch_size=6, precision="bf16"),
                        Config(batch_size=4, precision="bf16", checkpoint_segments=6, checkpoint_policy="selective"),
                        Config(batch_size=4, precision="bf16", checkpoint_segments=6))
#: GPT-2 small (benchmarks/gpu/gpt124m.py) bf16 b=32 on the H200, a probe without and one with activation
#: offload (the same log, "activation offload": 47.9 -> 24.9 GiB, GiB of 2**30 bytes).
H200_GPT2_SMALL_PLAIN, H200_GPT2_SMALL_SAVE_ON_CPU = 47.9, 24.9


@pytest.mark.slow  # GPT-2 medium's two traces: about 15 s on two cores
def test_one_trace_meets_gpt2_mediums_peaks_measured_on_an_h200_within_ten_percent(monkeypatch):
    pytest.importorskip("transformers")
    for name, value in (("GPT124M_LAYERS", "24"), ("GPT124M_WIDTH", "1024"), ("GPT124M_SAMPLES", "1024")):
        monkeypatch.setenv(name, value)
    configs = [config for config, _ in H200_GPT2_MEDIUM] + list(H200_GPT2_MEDIUM_OOM)
    predicted = _one_trace(os.path.join(REPO, "benchmarks", "gpu", "gpt124m.py"), configs)
    _within_ten_percent(predicted, [(config, int(gib * 2**30)) for config, gib in H200_GPT2_MEDIUM], "GPT-2 medium")
    usable = 14.40 * 2**30
    assert all(predicted[config] > usable for config in H200_GPT2_MEDIUM_OOM), predicted  # none predicted to fit


@pytest.mark.slow  # GPT-2 small's two traces, with and without its own save_on_cpu: about 20 s on two cores
def test_one_trace_meets_gpt2_smalls_peaks_with_and_without_offload_on_an_h200_within_ten_percent(monkeypatch):
    """The offloaded probe ran autofit's offload as it was then, PyTorch's `save_on_cpu` around each block (every
    tensor a block saves copied, synchronously, its weights' too), not the offload autofit runs now (which leaves
    parameters and small tensors on the device, and holds a block while the next one runs): so that peak is
    met by the script that wraps its own blocks in `save_on_cpu` (GPT124M_SAVE_ON_CPU=1, the estimator counting
    a script's own offload), never by the config `offload_activations`, whose arithmetic describes the new one."""
    pytest.importorskip("transformers")
    path = os.path.join(REPO, "benchmarks", "gpu", "gpt124m.py")
    config = Config(batch_size=32, precision="bf16")
    plain = _one_trace(path, [config])
    monkeypatch.setenv("GPT124M_SAVE_ON_CPU", "1")
    own_offload = _one_trace(path, [config])
    _within_ten_percent(plain, [(config, int(H200_GPT2_SMALL_PLAIN * 2**30))], "GPT-2 small")
    _within_ten_percent(own_offload, [(config, int(H200_GPT2_SMALL_SAVE_ON_CPU * 2**30))], "GPT-2 small, save_on_cpu")


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


@pytest.mark.slow  # GPT-2 small's traces through nanoGPT's train.py: about 40 s on two cores
def test_nanogpt_train_py_estimated_for_cuda_meets_its_peaks_on_an_h100(tmp_path, monkeypatch):
    """Its CUDA branch (`device_type == 'cuda'`: bf16 autocast, fused AdamW) is what ran there; estimated
    eager, its program traced at 2 micro-batches a step (the gradients held from the second on, as at its 15),
    where the H100 ran it compiled: the one-trace estimate within 10% of each peak."""
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
    monkeypatch.setenv("AUTOFIT_SCRIPT_ARGS", json.dumps(["--eval_iters=1", "--compile=False",
                                                          "--gradient_accumulation_steps=2"]))
    configs = [Config(batch_size=m.batch_size, accumulation_steps=2, precision=m.precision) for m, _ in peaks]
    predicted = _one_trace(str(tmp_path / "train.py"), configs)
    _within_ten_percent({m: predicted[c] for (m, _), c in zip(peaks, configs)}, peaks, "nanoGPT's train.py")
