"""`autofit probe` and `autofit devices` driven through click's CliRunner."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from autofit.cli import cli
from autofit.probing import SCRIPT_ARGS_ENV
from tests.support import script


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_probe_json_reports_an_ok_probe():
    result = invoke("probe", script("fits_small.py"), "--batch-size", "4", "--memory-limit", "1GiB", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["result"]["status"] == "ok"
    assert data["result"]["config"]["batch_size"] == 4
    assert data["result"]["peak_bytes"] < 2**30 == data["result"]["limit_bytes"]


def test_a_script_that_parses_its_arguments_at_import_gets_its_defaults_in_a_probe():
    # pytorch/examples call argparse's parse_args() at import: the worker's own argv must not reach it
    result = invoke("probe", script("parses_args.py"), "--batch-size", "4", "--memory-limit", "1GiB", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["result"]["status"] == "ok"


@pytest.mark.slow  # a real probe in a worker; the start script's arguments are probed in the default tier
def test_a_decorated_script_gets_the_arguments_after_the_double_dash(monkeypatch):
    monkeypatch.delenv(SCRIPT_ARGS_ENV, raising=False)  # the command sets it for its workers: undone here
    result = invoke("probe", script("parses_args.py"), "--batch-size", "4", "--memory-limit", "1GiB", "--json",
                    "--", "--lr=0.001")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["result"]["status"] == "ok"
    refused = invoke("probe", script("parses_args.py"), "--batch-size", "4", "--", "--no-such-flag")
    assert refused.exit_code != 0  # argparse in the script refused it: the arguments reached it
    assert "failed while loading: SystemExit: 2" in refused.output


def test_probe_text_reports_oom_with_exit_1():
    result = invoke("probe", script("fits_small.py") + ":train", "--batch-size", "2000", "--memory-limit", "768MiB")
    assert result.exit_code == 1
    assert "status       oom" in result.output
    assert "hint" in result.output


def test_probe_error_shows_the_users_traceback():
    result = invoke("probe", script("raises.py"), "--batch-size", "2")
    assert result.exit_code == 1
    assert "ValueError: bad shape 2" in result.output
    assert "helper_that_fails" in result.output


@pytest.mark.parametrize("args,message", [
    (["missing.py", "--batch-size", "4"], "does not exist"),
    ([script("no_function.py"), "--batch-size", "4"], "decorated with @autofit"),
    ([script("two_functions.py"), "--batch-size", "4"], "several @autofit functions"),
    ([script("two_functions.py") + ":nope", "--batch-size", "4"], "'nope' must be defined"),
    ([script("raises.py"), "--batch-size", "4", "--precision", "fp8"], "Invalid value for '--precision'"),
    ([script("raises.py"), "--batch-size", "0"], "Invalid value for '--batch-size'"),
    ([script("raises.py"), "--batch-size", "4", "--memory-limit", "lots"], "Invalid value for '--memory-limit'"),
    ([script("raises.py"), "--batch-size", "4", "--memory-limit", "8MiB"], "needs just to start"),
    ([script("raises.py"), "--batch-size", "4", "--device", "cuda"], "no NVIDIA GPU"),
    ([script("raises.py"), "--batch-size", "4", "--gpu", "0"], "no NVIDIA GPU"),
    ([script("raises.py"), "--batch-size", "4", "--gpu", "0"], "or leave out --gpu and --device cuda to probe the CPU"),
    ([script("raises.py"), "--batch-size", "4", "--memory-limit", "999GiB"], "must be at most cpu:0's memory ("),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = invoke("probe", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_script_broken_at_import_exits_1_with_its_traceback():
    result = invoke("probe", script("import_error.py"), "--batch-size", "4")
    assert result.exit_code == 1
    assert "broken at import" in result.output


def test_a_search_above_the_devices_memory_is_refused_before_any_probe(tmp_path):
    """Issue 54: `--memory-limit 999GiB` on a 23.5 GiB machine searched "usable 899.10 GiB"."""
    result = invoke("search", script("fits_small.py"), "--device", "cpu", "--memory-limit", "999GiB", "--budget", "30s",
                    "--storage", f"sqlite:///{tmp_path}/s.db")
    assert result.exit_code == 2, result.output
    assert "The memory limit (--memory-limit) must be at most cpu:0's memory (" in result.output
    assert "but got 999.00 GiB" in result.output and not (tmp_path / "s.db").exists()


def test_devices_lists_the_cpu_with_its_memory():
    result = invoke("devices", "--json")
    assert result.exit_code == 0
    found = json.loads(result.output)
    assert found[0]["type"] == "cpu" and found[0]["total_bytes"] > 2**30


@pytest.mark.slow  # a real worker through the command line (5 s); tests/whitebox/test_unconverted_script.py is fast
def test_an_unconverted_module_level_script_is_refused_before_any_of_it_runs(tmp_path, monkeypatch):
    """The worker once imported such a script, so its whole training ran before the line that it has no
    @autofit function, a line that did not mention autofit.start."""
    marker = tmp_path / "ran"
    monkeypatch.setenv("MODULE_LEVEL_RAN", str(marker))
    result = invoke("probe", script("module_level.py"), "--batch-size", "4")
    assert result.exit_code == 2, result.output
    assert "or call autofit.start(...) at module level" in result.output and "none of it ran" in result.output
    assert not marker.exists()
