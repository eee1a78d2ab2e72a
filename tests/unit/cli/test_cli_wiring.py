"""The command line is wiring: the group's context object resolves the device and storage the options
name, autofit's errors leave as click exceptions shown as one line with exit status 2 (bad input) or
1, and `autofit probe` hands its work (runner, precision, nodes) to autofit.probing."""
from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from autofit.cli import cli
from autofit.errors import UsageError
from tests.support import script


def invoke(*args: str, **kwargs):
    return CliRunner().invoke(cli, list(args), **kwargs)


def test_bad_input_leaves_as_a_click_usage_error_with_exit_status_2():
    result = invoke("probe", "missing.py", "--batch-size", "4", standalone_mode=False)
    assert isinstance(result.exception, click.UsageError)
    assert result.exception.exit_code == 2
    assert isinstance(result.exception.__cause__, UsageError)
    shown = invoke("probe", "missing.py", "--batch-size", "4")
    assert shown.exit_code == 2
    assert shown.output.startswith("autofit: error: The training script must be an existing file")
    assert shown.output.count("\n") == 1 and "Usage:" not in shown.output


def test_a_script_broken_at_import_leaves_as_a_click_exception_with_its_traceback_and_exit_status_1():
    result = invoke("probe", script("import_error.py"), "--batch-size", "4", standalone_mode=False)
    assert isinstance(result.exception, click.ClickException) and result.exception.exit_code == 1
    assert "import_error.py" in result.exception.traceback
    shown = invoke("probe", script("import_error.py"), "--batch-size", "4")
    assert shown.exit_code == 1
    assert shown.output.rstrip().splitlines()[-1].startswith("autofit: error: The script import_error.py failed")
    assert "Traceback" in shown.output  # the user's traceback, before the one line


@pytest.mark.parametrize("args,message", [
    (["--device", "cpu", "--gpu", "0"], "--gpu must go with --device cuda, but got --device cpu --gpu 0."),
    (["--precision", "tf32"], "The precision must be one the device runs (fp32, bf16, fp16), but got tf32."),
    (["--nnodes", "2"], "--nnodes needs --rdzv-endpoint HOST:PORT"),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:29500"],
     "--node-rank must be in [0, --nnodes), but got --nnodes 2 --node-rank 2."),
])
def test_probe_options_that_cannot_work_are_one_line_and_exit_2(args, message):
    result = invoke("probe", script("fits_small.py"), "--batch-size", "4", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


