"""One default device for every entry point (autofit.devices.default_device): `train.search()` once probed the CPU
by default (SearchSettings' device="cpu") and wrote `*.cpu.best.json`, which a normal call on a GPU never reads,
while the command line and the normal call chose the GPU; and `AUTOFIT_DEVICE=CUDA` was a usage error in a
search and a torch traceback in a normal run."""

from __future__ import annotations

import pytest

from autofit.devices import DeviceInfo
from autofit.errors import UsageError
from autofit.normal_run import resolve_run_config
from autofit.search import SearchSettings

H100 = DeviceInfo(type="cuda", index=0, name="NVIDIA H100 80GB HBM3", total_bytes=80 * 2**30)


class _Options:
    """What a normal run reads of a decorated function's options, for a function with nothing declared."""

    global_batch = None

    @staticmethod
    def unsearched_config():
        from autofit import Config

        return Config(batch_size=1), ""


class _Decorated:
    options = _Options()

    @staticmethod
    def fn(run):  # the function's source file names where the run looks for a best config
        pass


def test_a_search_from_python_probes_where_a_normal_run_trains(monkeypatch, capsys):
    monkeypatch.delenv("AUTOFIT_DEVICE", raising=False)
    monkeypatch.setattr("autofit.devices._cuda.cuda_devices", lambda: [H100])
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # this process imported a CPU-only torch
    settings = SearchSettings(script="train.py")
    assert (settings.device, settings.index) == ("cuda", 0)
    assert "no device= given: probing cuda:0" in capsys.readouterr().err
    assert SearchSettings(script="train.py", device="cpu").device == "cpu"  # a device named wins
    monkeypatch.setattr("autofit.devices._cuda.cuda_devices", lambda: [])
    assert (SearchSettings(script="train.py").device, capsys.readouterr().err) == ("cpu", "")


def test_a_gpu_that_this_torch_cannot_use_is_no_default(monkeypatch):
    """NVML sees a GPU, the imported torch has no CUDA: a normal run trains on the CPU, and so a search probes it."""
    monkeypatch.delenv("AUTOFIT_DEVICE", raising=False)
    monkeypatch.setattr("autofit.devices._cuda.cuda_devices", lambda: [H100])
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert SearchSettings(script="train.py").device == "cpu"
    assert resolve_run_config(_Decorated(), None, None).device == "cpu"


@pytest.mark.parametrize("named, device", [("CUDA", "cuda:0"), ("Cuda:1", "cuda:1"), ("CPU", "cpu"), (" cpu ", "cpu")])
def test_autofit_device_in_any_case_names_the_same_device_to_a_search_and_a_normal_run(monkeypatch, tmp_path,
                                                                                         named, device):
    monkeypatch.setenv("AUTOFIT_DEVICE", named)
    monkeypatch.delenv("AUTOFIT_CONFIG", raising=False)
    kind, _, index = device.partition(":")
    settings = SearchSettings(script="train.py")
    assert (settings.device, settings.index) == (kind, int(index or 0))
    monkeypatch.setattr("autofit.normal_run._device_tag", lambda d: d.split(":")[0])  # no GPU here to name
    assert resolve_run_config(_Decorated(), None, None).device == device


def test_an_autofit_device_that_names_no_device_is_one_line_in_a_normal_run_too(monkeypatch):
    monkeypatch.setenv("AUTOFIT_DEVICE", "tpu")
    with pytest.raises(UsageError, match="AUTOFIT_DEVICE must name a device"):
        resolve_run_config(_Decorated(), None, None)
