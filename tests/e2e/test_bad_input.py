"""Bad input at the command line: a script that does not compile is one line and exit 2 from every
command that takes one; a script that raises at import shows only its own frames; and a search that
fails before its first probe leaves no study behind, while a study that was there before stays."""
from __future__ import annotations

import optuna
import pytest
from click.testing import CliRunner

from autofit.cli import cli
from autofit.probing import JobBoard
from tests.support import script

BROKEN = "from autofit import autofit\n\n\n@autofit\ndef train(run)\n    pass\n"


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def studies(storage: str) -> dict[str, int]:
    """Each study in the storage, with its number of trials."""
    return {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(storage)}


@pytest.mark.parametrize("command", [
    ["probe", "--batch-size", "4"],
    ["search", "--budget", "30s", "--memory-limit", "1GiB"],
    ["estimate"],
])
def test_a_syntax_error_is_one_line_naming_the_file_the_line_and_its_text_and_exit_2(tmp_path, command):
    broken = tmp_path / "broken.py"
    broken.write_text(BROKEN)
    storage = f"sqlite:///{tmp_path / 'autofit.db'}"
    name, *options = command
    result = invoke(name, str(broken), *options, *(["--storage", storage] if name == "search" else []))
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1, result.output
    assert f"{broken}:5 is not (SyntaxError: expected ':'): `def train(run)`. Fix it" in result.output
    assert "Traceback" not in result.output
    if name == "search":
        assert studies(storage) == {}  # refused before any study is opened


def test_a_script_raising_at_import_shows_its_own_frames_only():
    result = invoke("probe", script("import_error.py"), "--batch-size", "4")
    assert result.exit_code == 1
    shown = result.output.rstrip().splitlines()
    assert shown[0] == "Traceback (most recent call last):"
    assert shown[1].startswith(f'  File "{script("import_error.py")}", line ')
    assert "autofit" not in "\n".join(shown[1:-1]) and "importlib" not in result.output
    assert shown[-2] == "RuntimeError: this script is broken at import"
    assert shown[-1].startswith("autofit: error: The script import_error.py failed while loading")


@pytest.mark.slow  # real searches: the default tier keeps the one-line syntax error and the import frames
@pytest.mark.parametrize("target,limit,status", [
    ("import_error.py", "1GiB", 1),  # the script raises at import
    ("fits_small.py", "16MiB", 2),  # a limit below what the worker needs just to start
])
def test_a_search_that_fails_before_its_first_probe_leaves_no_study(tmp_path, target, limit, status):
    storage = f"sqlite:///{tmp_path / 'autofit.db'}"
    result = invoke("search", script(target), "--memory-limit", limit, "--budget", "30s", "--storage", storage)
    assert result.exit_code == status, result.output
    assert studies(storage) == {}
    assert "(no studies)" in invoke("studies", "--storage", storage).output


@pytest.mark.slow
@pytest.mark.parametrize("fresh", [False, True])
def test_a_failed_search_keeps_a_study_that_was_there_before(tmp_path, fresh):
    storage = f"sqlite:///{tmp_path / 'autofit.db'}"
    earlier = optuna.create_study(study_name="kept", storage=storage, direction="maximize")
    earlier.add_trial(optuna.trial.create_trial(value=1.0))
    result = invoke("search", script("import_error.py"), "--memory-limit", "1GiB", "--budget", "30s",
                    "--storage", storage, "--study", "kept", *(["--fresh"] if fresh else []))
    assert result.exit_code == 1, result.output
    # --fresh deleted the earlier trials on the user's word; a study that was there is never deleted
    assert studies(storage) == {"kept": 0 if fresh else 1}


def test_followers_see_a_deleted_study_as_no_session(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'autofit.db'}")
    optuna.create_study(study_name="s", storage=storage)
    board = JobBoard(storage, "s")
    board.open_session(nnodes=2, nproc=1)
    assert board.session()["state"] == "running"
    optuna.delete_study(study_name="s", storage=storage)  # node 0's search failed before its first probe
    assert board.session() is None
    optuna.create_study(study_name="s", storage=storage)  # node 0 runs again
    board.open_session(nnodes=2, nproc=1)
    assert board.session()["state"] == "running"
