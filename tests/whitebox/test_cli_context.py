"""The CLI's context object (autofit.cli._context): the device and storage the group's options name, resolved once."""

from __future__ import annotations

import pytest

from autofit.cli._context import CliContext
from autofit.errors import UsageError


def test_the_context_object_resolves_the_device_the_options_name():
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
