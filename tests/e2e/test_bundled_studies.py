"""The recorded searches that ship in autofit/recorded/ (scripts/record_bundled_studies.sh)."""
from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

import autofit
from autofit.cli import cli
from autofit.export import read_best
from autofit.study import bundled_storage_url

RECORDED = os.path.join(os.path.dirname(autofit.__file__), "recorded")
STEMS = ("gpt", "cnn", "mlp")


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.parametrize("stem", STEMS)
def test_each_bundled_study_ships_a_recorded_search(stem):
    best = read_best(os.path.join(RECORDED, f"{stem}.train.best.json"))
    stored = autofit.load_study(stem, storage=bundled_storage_url())
    assert stored.name == f"{stem}.train-cpu0" and stored.meta.script.endswith(f"{stem}.py")
    assert stored.best() == best.config
    assert stored.document().config == best.config
    frame = stored.trials_frame()
    assert len(frame) >= 3 and frame["feasible"].any()
    assert all(stored.log_path(int(n)) is not None for n in frame["trial"])  # the probes' output ships too


def test_commands_read_the_bundled_studies_without_a_storage(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no studies/autofit.db here
    listed = invoke("studies")
    assert listed.exit_code == 0 and "listing the recorded studies" in listed.stderr
    assert all(f"{stem}.train-cpu0" in listed.stdout for stem in STEMS)
    shown = invoke("show", "--study", "gpt")
    assert shown.exit_code == 0 and "reading the recorded study gpt.train-cpu0" in shown.stderr
    assert "best: " in shown.stdout and "why: " in shown.stdout
    exported = invoke("export", "--study", "mlp", "--out", "mlp.json")
    assert exported.exit_code == 0
    assert read_best("mlp.json").config == read_best(os.path.join(RECORDED, "mlp.train.best.json")).config
    reported = invoke("report", "--study", "cnn", "--out", "cnn.html")
    assert reported.exit_code == 0 and (tmp_path / "cnn.html").read_text().count("<img") == 5
