"""Trust, round five (issue 52, item 3), the pure part: a script's version is its code (a comment, a blank line,
the indentation's width or a docstring leave it alone) and its local modules' code, found among the modules a
process loaded; a study ranks, and a best-config file names, the probes of one version, and says which file
changed. The searches and normal runs themselves: tests/e2e/test_script_modules.py."""

from __future__ import annotations

import os
import types

import optuna
import pytest

from autofit import Config
from autofit.findings import best_document
from autofit.planner import SearchSpace
from autofit.probing import ProbeResult, RecordedVersion, ScriptVersion, code_sha256, local_modules, project_root
from autofit.study import CODE_ATTR, SCRIPT_ATTR, other_script_probes, script_changes, script_trials
from tests.support.studies import study_of

CODE = '''"""Train a small model."""
import torch

from helper import WIDTH  # the model's width


def train(run):
    model = torch.nn.Linear(WIDTH, 1)
    return model(torch.ones(run.batch_size, WIDTH)).sum()
'''
#: The same code, laid out otherwise: comments, blank lines, another indentation, a docstring reworded,
#: a call broken over lines.
RELAID = '''"""Train a small model, and say why."""

import torch
# the helper holds the width
from helper import WIDTH
def train(run):
  """The function autofit searches."""
  model = torch.nn.Linear(WIDTH,
                          1)   # one output

  return model(torch.ones(run.batch_size, WIDTH)).sum()
'''


def _write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_the_code_hash_ignores_layout_comments_and_docstrings_and_nothing_python_runs(tmp_path):
    code = code_sha256(_write(tmp_path / "a.py", CODE))
    assert code == code_sha256(_write(tmp_path / "b.py", RELAID))
    assert code != code_sha256(_write(tmp_path / "c.py", CODE.replace("sum()", "mean()")))
    assert code != code_sha256(_write(tmp_path / "d.py", CODE.replace("(WIDTH, 1)", "(WIDTH, 2)")))
    assert code != code_sha256(_write(tmp_path / "e.py", CODE.replace("    return", "    x = 'not a docstring'\n    return")))
    broken = _write(tmp_path / "f.py", "def f(:\n  (\n")  # does not tokenize: its bytes
    assert code_sha256(broken) is not None and code_sha256(str(tmp_path / "missing.py")) is None


def test_local_modules_are_the_projects_loaded_files_outside_the_environment(tmp_path):
    """Under the project's root (found from a marker above the script): the helper beside the script and a
    package of the project, by their paths from the root; not the script, the environment, or autofit."""
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "models").mkdir()
    (tmp_path / ".venv" / "lib" / "site-packages").mkdir(parents=True)
    script = _write(tmp_path / "scripts" / "train.py", CODE)
    helper = _write(tmp_path / "scripts" / "helper.py", "WIDTH = 8\n")
    gpt = _write(tmp_path / "models" / "gpt.py", "LAYERS = 2\n")
    installed = _write(tmp_path / ".venv" / "lib" / "site-packages" / "lib.py", "X = 1\n")
    loaded = {name: types.SimpleNamespace(__file__=path) for name, path in
              {"train": script, "helper": helper, "models.gpt": gpt, "lib": installed, "os": os.__file__,
               "autofit": optuna.__file__.replace("optuna", "autofit"), "builtin": None}.items()}
    assert project_root(script) == str(tmp_path)
    assert local_modules(script, loaded) == {"models/gpt.py": code_sha256(gpt), "scripts/helper.py": code_sha256(helper)}


def _probe(batch: int, rate: float, modules: dict[str, str]) -> ProbeResult:
    return ProbeResult(status="ok", config=Config(batch_size=batch), samples_per_s=rate, peak_bytes=batch * 2**20,
                       step_time_median_s=1.0, step_time_iqr_s=0.02, wall_s=1.0, modules=modules)


def _stamps(version: ScriptVersion) -> dict:
    """A trial's stamps as Session.ask writes them for a search of `version`."""
    return {SCRIPT_ATTR: version.sha256, CODE_ATTR: version.code_sha256}


def test_probes_of_an_older_helper_are_another_version_and_a_comment_changes_nothing(tmp_path):
    """b=32 ran under the helper at width 256, b=8 under 8192: the study ranks b=8 alone, names helper.py as
    what changed, and the file records the helper's code. A comment added to the script keeps both."""
    script = _write(tmp_path / "train.py", CODE)
    helper = tmp_path / "helper.py"
    narrow = code_sha256(_write(helper, "WIDTH = 256\n"))
    before = ScriptVersion.of(script)
    wide = code_sha256(_write(helper, "WIDTH = 8192\n"))
    now = ScriptVersion.of(script)
    space = SearchSpace.build(batch_range=(1, 64), precision=("fp32",))
    study = study_of([_probe(32, 200.0, {"helper.py": narrow}), _probe(8, 100.0, {"helper.py": wide})], space, (1, 64),
                     attrs=[_stamps(before), _stamps(now)])
    study.set_user_attr("autofit", {**study.user_attrs["autofit"], "script_sha256": now.sha256,
                                    "code_sha256": now.code_sha256, "modules": now.known(["helper.py"])})
    assert [t.number for t in script_trials(study, now)] == [1] and other_script_probes(study, now) == 1
    assert script_changes(study, now) == ["helper.py"]
    assert [t.number for t in script_trials(study)] == [1]  # the study's own version, as its settings record it
    document = best_document(study, "sqlite:///x.db", stopped="done", partial=False).to_dict()
    assert document["config"]["batch_size"] == 8 and document["script"]["modules"] == {"helper.py": wide}
    _write(tmp_path / "train.py", "# a comment\n" + CODE.replace("\n\n\n", "\n\n\n\n"))
    commented = ScriptVersion.of(script)
    assert commented.sha256 != now.sha256 and commented.code_sha256 == now.code_sha256
    assert [t.number for t in script_trials(study, commented)] == [1]
    _write(helper, "WIDTH = 8192  # wider\n")  # a comment in the helper: the same code
    assert ScriptVersion.of(script).changes(now.sha256, now.code_sha256, {"helper.py": wide}) == []
    helper.unlink()
    assert ScriptVersion.of(script).changes(now.sha256, now.code_sha256, {"helper.py": wide}) == ["helper.py (gone)"]


def test_studies_and_files_recorded_before_the_code_hash_compare_by_the_scripts_bytes(tmp_path):
    script = _write(tmp_path / "train.py", CODE)
    version = ScriptVersion.of(script)
    assert version.changes(version.sha256, None, None) == []
    assert version.changes("0" * 64, None, None) == ["train.py"]  # the bytes differ: as before
    assert version.changes(None, None, None) == []  # nothing recorded: nothing to say
    assert RecordedVersion(sha256="0" * 64).changes("0" * 64, "c" * 64, {"helper.py": "h"}) == []  # unknown module


@pytest.mark.parametrize("form", ["old", "new"])
def test_a_best_config_files_script_entry_reads_in_either_form(tmp_path, form):
    from autofit.export import ScriptEntry

    entry = {"path": "train.py", "function": "train", "sha256": "a" * 64}
    if form == "new":
        entry |= {"code_sha256": "b" * 64, "modules": {"helper.py": "c" * 64}}
    read = ScriptEntry.from_dict(entry)
    assert read.to_dict() == entry  # an old file writes back as it was
    assert (read.code_sha256, read.modules) == ((None, None) if form == "old" else ("b" * 64, {"helper.py": "c" * 64}))
