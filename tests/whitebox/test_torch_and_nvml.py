"""What torch can use beside what NVML sees (issue 54, item 2): NVML lists a GPU whatever torch was built for,
so on a GPU machine with a CPU-only torch (the commonest first mistake) `autofit devices` listed the GPU and
passed, and `python train.py` trained on the CPU without a word. Now the listing shows torch's view, and fails
with the fix; a search asked for the GPU names the fix; a normal run says where it trains and why. Against the
fake NVML of fake_cuda.py and this machine's torch, a CPU-only build."""

from __future__ import annotations

import torch
from click.testing import CliRunner

import autofit.devices._cuda as cuda_mod
from autofit.cli import cli
from autofit.devices import INSTALL_URL, TorchView, default_device, default_device_line, gpu_problem
from autofit.devices._cuda import CudaBackend, cuda_devices, driver_cuda_version
from autofit.errors import UsageError

assert torch.version.cuda is None  # these tests stand for a CPU-only torch: the one this machine has


def test_devices_shows_torchs_view_and_fails_with_the_one_line_fix(nvml):
    result = CliRunner().invoke(cli, ["devices"])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[1].startswith("cuda:0  NVIDIA A100-SXM4-80GB  80.00 GiB total")  # what NVML sees
    assert f"torch {torch.__version__}: a CPU-only build (no CUDA)" in lines  # beside what torch can use
    fix = lines[-1]
    assert fix == (f"autofit: error: torch {torch.__version__} is a CPU-only build, so it cannot use the NVIDIA "
                   f"A100-SXM4-80GB NVML sees (and 1 more): install PyTorch's CUDA build into this environment "
                   f"(the command for your system: {INSTALL_URL}); then run `autofit devices` again.")


def test_devices_passes_where_torch_can_use_the_gpu(nvml, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    result = CliRunner().invoke(cli, ["devices"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1].endswith(": 2 GPUs usable")


def test_devices_passes_on_a_machine_without_a_gpu(monkeypatch):
    monkeypatch.setattr(cuda_mod, "_load_nvml", lambda: None)
    result = CliRunner().invoke(cli, ["devices"])
    assert result.exit_code == 0, result.output
    assert "(no NVIDIA GPU visible: NVML found none)" in result.output


def test_a_cuda_build_newer_than_the_driver_is_named_with_the_drivers_cuda(nvml, monkeypatch):
    monkeypatch.setattr(nvml, "nvmlSystemGetCudaDriverVersion", lambda: 12020, raising=False)
    assert driver_cuda_version() == "12.2"
    view = TorchView(version="2.8.0+cu128", cuda="12.8", available=False)
    said = gpu_problem(cuda_devices(), view, driver_cuda_version())
    assert said.startswith("torch 2.8.0+cu128 is built for CUDA 12.8, but it cannot use the NVIDIA A100-SXM4-80GB "
                           "NVML sees (and 1 more); the driver runs CUDA 12.2 at most: install the PyTorch build for "
                           "your driver's CUDA")
    assert gpu_problem(cuda_devices(), TorchView(version="2.8.0+cu128", cuda="12.8", available=True)) is None
    assert gpu_problem([], view) is None


def test_an_nvml_without_the_drivers_cuda_version_answers_none(nvml):
    assert not hasattr(nvml, "nvmlSystemGetCudaDriverVersion") and driver_cuda_version() is None


def test_a_normal_run_and_a_search_from_python_fall_back_to_the_cpu_saying_why(nvml, monkeypatch, capsys):
    monkeypatch.delenv("AUTOFIT_DEVICE", raising=False)
    kind, index, why = default_device()  # torch is imported here, as in a normal run
    assert (kind, index) == ("cpu", 0) and "is a CPU-only build" in why and INSTALL_URL in why
    line = default_device_line(kind, index, why, given="device=", cpu='device="cpu"')
    assert line.startswith("autofit: no device= given: probing cpu:0 (torch ") and INSTALL_URL in line
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_device() == ("cuda", 0, "a GPU is visible")


def test_a_cuda_probe_on_a_cpu_only_torch_says_what_to_install(nvml):
    try:
        CudaBackend(0).torch_device()
    except UsageError as refused:
        said = str(refused)
    assert said.startswith("The device cuda needs a PyTorch built with CUDA and a working driver, but torch")
    assert "is a CPU-only build" in said and INSTALL_URL in said and said.endswith("--device cpu.")


def test_a_bf16_probe_on_a_gpu_before_ampere_says_to_probe_fp16(monkeypatch):
    """The README's first probe of a script asks bf16, which a T4 or V100 does not run (issue 54, item 5)."""
    import contextlib
    from types import SimpleNamespace

    import pytest

    from autofit.config import Config
    from autofit.probing import ProbeSettings, probe_once

    loaded = SimpleNamespace(start=lambda: SimpleNamespace(precisions=("fp32", "fp16")))
    monkeypatch.setattr(ProbeSettings, "runner", lambda self, budget=None: contextlib.nullcontext(loaded))
    settings = ProbeSettings(script="train.py", config=Config(batch_size=16, precision="bf16"), device="cuda",
                             probe_process="persistent")
    with pytest.raises(UsageError, match=r"but got bf16: bf16 needs an Ampere or newer GPU \(compute capability "
                                         r"8\.0\); probe --precision fp16 here\.$"):
        probe_once(settings)
