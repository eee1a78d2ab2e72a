"""The device --help states as the default is the one the code resolves (issue 45, item 4): $AUTOFIT_DEVICE,
else a visible GPU, else the CPU, in that order (white box: NVML's listing replaced)."""

from __future__ import annotations

import click
import pytest

from autofit.cli import cli


@pytest.mark.parametrize("name", ("search", "probe"))
def test_the_device_help_states_the_default_the_code_resolves(name, monkeypatch):
    """--help says: $AUTOFIT_DEVICE, else a visible GPU, else the CPU; the code does that, in that order."""
    from autofit.cli._context import CliContext
    from autofit.devices import _cuda

    device = next(p for p in cli.commands[name].params if "--device" in getattr(p, "opts", ()))
    assert "$AUTOFIT_DEVICE" in device.help and "visible GPU" in device.help and "else cpu" in device.help
    import torch

    monkeypatch.delenv("AUTOFIT_DEVICE", raising=False)
    monkeypatch.setattr(_cuda, "cuda_devices", lambda: [object()])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a CUDA build of torch, as on a GPU machine
    assert CliContext().device == "cuda"  # a visible GPU, no flag: the GPU, as the help says
    monkeypatch.setattr(_cuda, "cuda_devices", lambda: [])
    assert CliContext().device == "cpu"
    monkeypatch.setenv("AUTOFIT_DEVICE", "cpu")
    monkeypatch.setattr(_cuda, "cuda_devices", lambda: [object()])
    assert CliContext().device == "cpu"  # the variable before the GPU
