"""Trust, round five (issue 52, item 3), whole searches: a script's version covers the local modules it imports.
A study resumed after its imported helper.py widened the model 16x exports nothing of the old model's probes,
says helper.py changed, and the normal run says so too; a comment added to the script and its helper keeps
every earlier probe. The hashing and the study's choice of probes: tests/unit/probing/test_script_version.py."""

from __future__ import annotations

import os
import subprocess
import sys

import optuna
import pytest

from autofit.errors import NoFeasibleConfig
from autofit.export import read_best
from autofit.search import SearchSettings, run_search
from autofit.study import trial_result
from tests.support import REPO

TRAIN = '''"""A decorated function whose model's width comes from a helper module beside it."""
import torch

from autofit import autofit
from helper import WIDTH


@autofit
def train(run):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [torch.randn(run.batch_size, 64) for _ in range(4)]
    for _ in range(1 if not run.probing else 10**6):
        for x in run.batches(data):
            with run.autocast():
                wide = x.repeat(1, WIDTH // 64)
                loss = model(x).pow(2).mean() + wide.sigmoid().mean() * 1e-3
            run.backward(loss, opt)


if __name__ == "__main__":
    train()
'''
NARROW, WIDE = "WIDTH = 16 * 1024\n", "WIDTH = 16 * 16 * 1024\n"


def _search(tmp_path, budget_s: float, trials: int = 2):
    return run_search(SearchSettings(script=str(tmp_path / "train.py"), memory_limit=768 * 2**20, trials=trials,
                                     budget_s=budget_s, estimate=False, storage=f"sqlite:///{tmp_path}/s.db",
                                     study="modules", out=str(tmp_path / "best.json"), batch_range=(8, 8),
                                     precision=("fp32",)))


def _normal_run(tmp_path) -> str:
    ran = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": REPO, "AUTOFIT_CONFIG": str(tmp_path / "best.json")})
    assert ran.returncode == 0, ran.stderr[-3000:]
    return ran.stderr


def _probes(tmp_path) -> int:
    trials = optuna.load_study(study_name="modules", storage=f"sqlite:///{tmp_path}/s.db").trials
    return sum(trial_result(t) is not None for t in trials)


@pytest.mark.slow
def test_a_search_resumed_after_an_imported_helper_changed_exports_nothing_of_the_old_model(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "helper.py").write_text(NARROW)
    first = _search(tmp_path, 600)
    assert first.probes >= 1
    (tmp_path / "helper.py").write_text(WIDE)  # the model 16x wider; train.py unchanged

    # No probe fits the budget: the old helper's probes measured another model, so nothing is exported (the old
    # code exported fp32 b=8 from them), and the file stays the first search's; its normal run names the helper.
    with pytest.raises(NoFeasibleConfig, match=r"\(\d+ of the study's probes ran another version of the script"):
        _search(tmp_path, 1)
    assert "the training script changed since the search (helper.py)" in _normal_run(tmp_path)
    narrow = read_best(first.json_path).script.modules
    assert list(narrow) == ["helper.py"]  # the file records the helper's code it was measured with

    again = _search(tmp_path, 600)
    assert any(note.startswith("the script changed (helper.py):") for note in again.notes), again.notes
    assert again.probes >= 1 and read_best(again.json_path).script.modules["helper.py"] != narrow["helper.py"]
    assert "script changed since the search" not in _normal_run(tmp_path)


@pytest.mark.slow
def test_a_comment_in_the_script_and_its_helper_keeps_every_earlier_probe(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "helper.py").write_text(NARROW)
    first = _search(tmp_path, 600, trials=1)
    earlier = _probes(tmp_path)
    assert first.probes == earlier >= 1
    (tmp_path / "train.py").write_text("# a comment a user added\n" + TRAIN.replace("\n\n\n@autofit", "\n\n\n\n@autofit"))
    (tmp_path / "helper.py").write_text("# the width of the model\n" + NARROW)
    again = _search(tmp_path, 1)  # no budget for a probe: the earlier one still counts, and is exported
    assert not any("script changed" in note for note in again.notes), again.notes
    assert again.best == first.best and _probes(tmp_path) == earlier
    assert "script changed since the search" not in _normal_run(tmp_path)
