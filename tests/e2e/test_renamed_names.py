"""Renamed public names keep working: the old decorator argument or CLI flag is still taken, says in one
line which name replaced it, and giving both the old and the new name is bad input."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from autofit import autofit
from autofit.cli import cli
from autofit.errors import UsageError
from tests.support import script


def _train(run):
    return None


def test_the_decorators_batch_size_is_taken_as_batch_range_with_one_line(capsys):
    decorated = autofit(batch_size=(2, 8))(_train)
    assert decorated.options.batch_range == (2, 8)
    said = capsys.readouterr().err.strip().splitlines()
    assert said == ["autofit: @autofit(batch_size=...) is deprecated and will be removed: "
                    "use @autofit(batch_range=(lo, hi))"]


def test_the_new_decorator_name_says_nothing_and_both_names_are_refused(capsys):
    assert autofit(batch_range=(2, 8))(_train).options.batch_range == (2, 8)
    assert capsys.readouterr().err == ""
    with pytest.raises(UsageError, match="batch_range=.*batch_size="):
        autofit(batch_range=(2, 8), batch_size=(2, 8))


@pytest.mark.parametrize("old, new, given, field, value", [
    ("--batch-size", "--batch-range", ["--batch-size", "2:8"], "batch_range", (2, 8)),
    ("--workers", "--parallel", ["--workers", "2"], "parallel", 2),
])
def test_an_old_search_flag_reaches_the_search_under_its_new_name(monkeypatch, old, new, given, field, value):
    import autofit.search

    seen = []

    def search_here(settings, reporter):
        seen.append(settings)
        raise UsageError("stopped before probing")

    monkeypatch.setattr(autofit.search, "run_search", search_here)
    result = CliRunner().invoke(cli, ["search", script("fits_small.py"), *given])
    assert "stopped before probing" in result.output
    assert f"autofit: {old} is deprecated and will be removed: use {new}" in result.output
    assert getattr(seen[0], field) == value


@pytest.mark.parametrize("args", [
    ["search", "train.py", "--batch-size", "1:8", "--batch-range", "1:8"],
    ["search", "train.py", "--batch-range", "1:8", "--batch-size", "1:8"],
    ["estimate", "train.py", "--batch-size", "1:8", "--batch-range", "1:8"],
    ["search", "train.py", "--workers", "2", "--parallel", "2"],
    ["probe", "train.py", "--batch-size", "4", "--checkpoint", "1", "--checkpoint-segments", "1"],
])
def test_an_old_flag_with_its_new_name_is_bad_input(args):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "only, but got both" in result.output


@pytest.mark.slow  # 8 s: the default tier stays near 5 minutes
def test_the_probes_checkpoint_flag_sets_the_checkpoint_segments():
    result = CliRunner().invoke(cli, ["probe", script("fits_small.py"), "--batch-size", "4", "--checkpoint", "1",
                                      "--memory-limit", "1GiB", "--json"])
    assert "autofit: --checkpoint is deprecated and will be removed: use --checkpoint-segments" in result.stderr
    assert json.loads(result.stdout)["result"]["config"]["checkpoint_segments"] == 1


def test_old_flags_are_hidden_from_help():
    shown = CliRunner().invoke(cli, ["search", "--help"]).output + CliRunner().invoke(cli, ["probe", "--help"]).output
    assert "--batch-range" in shown and "--parallel" in shown and "--checkpoint-segments" in shown
    assert "--workers" not in shown and "--batch-size MIN" not in shown and "--checkpoint " not in shown


@pytest.mark.slow  # a real probe or estimate of 7-9 s: the default tier stays under 5 minutes
def test_probe_takes_its_timeout_as_probe_timeout_the_name_search_gives_it(tmp_path):
    """One quantity, one name: `probe --timeout` was `search --probe-timeout`. The old name still works, says
    so in one line, and both together are bad input."""
    runner = CliRunner()
    base = ["probe", script("hangs.py"), "--device", "cpu", "--batch-size", "1", "--json"]
    new = runner.invoke(cli, [*base, "--probe-timeout", "2s"])
    assert json.loads(new.stdout)["result"]["error_type"] == "StartTimeout" and "deprecated" not in new.stderr
    old = runner.invoke(cli, [*base, "--timeout", "2s"])
    assert json.loads(old.stdout)["result"]["error_type"] == "StartTimeout"
    assert "--timeout is deprecated and will be removed: use --probe-timeout" in old.stderr
    both = runner.invoke(cli, [*base, "--timeout", "2s", "--probe-timeout", "2s"])
    assert both.exit_code == 2 and "Give --probe-timeout only" in both.output
