"""A script that cannot load gets one clear line (a syntax error: where and what) or the user's own
frames (an exception at import), never autofit's, and a search that fails before its first probe
leaves no empty study behind; a study that existed before is never touched."""

from __future__ import annotations

import optuna
import pytest
from conftest import autofit_cli

from autofit.study._storage import open_storage

SYNTAX = "from autofit import autofit\n\n\n@autofit\ndef train(run)\n    pass\n"
RAISES = "import torch\nfrom autofit import autofit\nx = torch.ones(2) @ torch.ones(3)\n\n\n@autofit\ndef train(run):\n    pass\n"


def _search(tmp_path, name: str, source: str, *extra: str):
    (tmp_path / name).write_text(source)
    storage = f"sqlite:///{tmp_path}/s.db"
    done = autofit_cli("search", str(tmp_path / name), "--device", "cpu", "--memory-limit", "1GiB", "--budget", "30s",
                       "--storage", storage, *extra, cwd=tmp_path)
    return done, storage


def test_a_syntax_error_is_one_line_saying_where_and_what(tmp_path):
    done, _ = _search(tmp_path, "bad.py", SYNTAX)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "SyntaxError in bad.py, line 5: `def train(run)`: expected ':'" in lines[0]


@pytest.mark.slow
def test_an_exception_at_import_shows_the_users_frames_only(tmp_path):
    done, _ = _search(tmp_path, "raises.py", RAISES)
    assert done.returncode != 0
    assert 'raises.py", line 3, in <module>' in done.stderr
    assert "autofit/" not in done.stderr.replace("autofit: error", "") and "<frozen" not in done.stderr


@pytest.mark.slow
def test_a_search_that_fails_before_its_first_probe_leaves_no_study(tmp_path):
    done, storage = _search(tmp_path, "bad.py", SYNTAX)
    assert done.returncode != 0
    assert optuna.get_all_study_names(open_storage(storage)) == []
    listed = autofit_cli("studies", "--storage", storage, cwd=tmp_path)
    assert "(no studies)" in listed.stdout


@pytest.mark.slow
def test_a_study_that_existed_before_is_kept(tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    optuna.create_study(study_name="mine", storage=open_storage(storage))
    done, _ = _search(tmp_path, "bad.py", SYNTAX, "--study", "mine")
    assert done.returncode != 0
    assert optuna.get_all_study_names(open_storage(storage)) == ["mine"]
