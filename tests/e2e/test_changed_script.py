"""A search resumed after its script changed (issue 44): the old script's probes are kept but neither ranked,
exported nor taken as tried, so the same command probes the new script again, and the best file's sha256 is
the script its figures were measured under (the normal run warns when the script is not that one)."""

from __future__ import annotations

import os
import subprocess
import sys

import optuna
import pytest

from autofit.errors import NoFeasibleConfig
from autofit.export import read_best, script_sha256
from autofit.findings import load_study
from autofit.search import SearchSettings, run_search
from autofit.study import SCRIPT_ATTR, trial_result
from tests.support import REPO, script

NARROW, WIDE = "WIDTH = 16 * 1024", "WIDTH = 16 * 16 * 1024"


def _search(tmp_path, budget_s: float):
    return run_search(SearchSettings(script=str(tmp_path / "train.py"), memory_limit=768 * 2**20, trials=2,
                                     budget_s=budget_s, estimate=False, storage=f"sqlite:///{tmp_path}/s.db",
                                     study="changed", out=str(tmp_path / "best.json"), batch_range=(8, 8),
                                     precision=("fp32",)))


def _normal_run(tmp_path) -> str:
    ran = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": REPO, "AUTOFIT_CONFIG": str(tmp_path / "best.json")})
    assert ran.returncode == 0, ran.stderr[-3000:]
    return ran.stderr


@pytest.mark.slow
def test_a_search_resumed_after_its_script_widened_probes_it_again_and_exports_only_its_figures(tmp_path):
    source = open(script("widens.py")).read()
    assert NARROW in source
    train = tmp_path / "train.py"
    train.write_text(source)
    first = _search(tmp_path, 600)
    assert first.probes >= 1 and read_best(first.json_path).script.sha256 == script_sha256(str(train))
    train.write_text(source.replace(NARROW, WIDE))  # the model 16x wider
    wide = script_sha256(str(train))

    # A budget that holds no probe: nothing of the new script is measured, so nothing is exported; the file
    # stays the old script's, and the normal run of the new one says the script changed.
    with pytest.raises(NoFeasibleConfig, match=r"\(\d+ of the study's probes ran another version of the script"):
        _search(tmp_path, 1)
    assert read_best(str(tmp_path / "best.json")).script.sha256 != wide
    assert "script changed since the search" in _normal_run(tmp_path)

    again = _search(tmp_path, 600)
    assert any("ran another version of it" in note for note in again.notes)
    trials = optuna.load_study(study_name="changed", storage=f"sqlite:///{tmp_path}/s.db").trials
    probed = {t.number: trial_result(t) for t in trials if t.user_attrs.get(SCRIPT_ATTR) == wide and trial_result(t)}
    assert again.probes == len(probed) >= 1  # probed again, and counted alone
    best = read_best(again.json_path)
    assert best.script.sha256 == wide
    winner = load_study("changed", f"sqlite:///{tmp_path}/s.db").ranked()[0]
    assert {o.trial for o in winner.measurement.probes} <= set(probed)  # its figures are the new script's probes
    assert best.measured.peak_bytes in {r.peak_bytes for r in probed.values()}
    assert "script changed since the search" not in _normal_run(tmp_path)
