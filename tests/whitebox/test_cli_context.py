"""The CLI's context object (autofit.cli._context): the device and storage the group's options name, resolved once."""

from __future__ import annotations

import pytest

from autofit.cli._context import CliContext
from autofit.errors import UsageError


def test_the_context_object_resolves_the_device_the_options_name(monkeypatch):
    monkeypatch.delenv("AUTOFIT_DEVICE", raising=False)
    monkeypatch.setattr("autofit.devices._cuda.cuda_devices", lambda: [])  # no GPU visible: the CPU
    assert (CliContext().device, CliContext().index, CliContext().gpus) == ("cpu", 0, ())
    assert (CliContext(gpu=3).device, CliContext(gpu=3).index) == ("cuda", 3)
    several = CliContext(gpu=(2, 5))
    assert (several.device, several.index, several.gpus) == ("cuda", 2, (2, 5))
    assert CliContext(device_type="cuda").device == "cuda"
    with pytest.raises(UsageError, match="--gpu must go with --device cuda"):
        _ = CliContext(device_type="cpu", gpu=(0, 1)).device


def test_the_storage_is_opened_once_and_only_when_asked(tmp_path):
    state = CliContext(storage_url=f"sqlite:///{tmp_path}/s.db")
    assert not (tmp_path / "s.db").exists()
    assert state.storage() is state.storage()
    assert (tmp_path / "s.db").exists()


def test_with_no_device_flag_a_command_probes_where_a_normal_run_trains(monkeypatch, capsys):
    """`autofit search train.py` with no device flag once probed the CPU while `python train.py` then trained
    on CUDA and never read the CPU's file: now a visible GPU, or $AUTOFIT_DEVICE, is the default, said once."""
    from autofit.devices import DeviceInfo

    monkeypatch.delenv("AUTOFIT_DEVICE", raising=False)
    gpu = DeviceInfo(type="cuda", index=0, name="NVIDIA H100 80GB HBM3", total_bytes=80 * 2**30)
    monkeypatch.setattr("autofit.devices._cuda.cuda_devices", lambda: [gpu])
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # this process imported a CPU-only torch
    state = CliContext()
    assert (state.device, state.index) == ("cuda", 0)
    assert capsys.readouterr().err.count("no --device given: probing cuda:0") == 1
    assert CliContext(device_type="cpu").device == "cpu"  # a flag wins
    monkeypatch.setenv("AUTOFIT_DEVICE", "cuda:1")
    assert (CliContext().device, CliContext().index) == ("cuda", 1)
    monkeypatch.setenv("AUTOFIT_DEVICE", "cpu")
    assert CliContext().device == "cpu"
    monkeypatch.setenv("AUTOFIT_DEVICE", "tpu")
    with pytest.raises(UsageError, match="AUTOFIT_DEVICE must name a device"):
        _ = CliContext().device
