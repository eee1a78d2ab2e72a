"""A knob added by its declaration (issue 38: channels-last memory format, in config.py, the run's knobs and its
face): a real search of a convolution model that offers it probes it on its fastest config, stores it as a
trial param and a frame column, exports it where it won, and the normal run trains in the format the file says."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import optuna
import pytest

from autofit.findings import load_study
from autofit.study import trial_config
from tests.support import REPO, autofit_cli, script

pytestmark = pytest.mark.slow


def test_a_search_tries_channels_last_on_its_leader_and_the_normal_run_trains_as_the_file_says(tmp_path):
    storage = f"sqlite:///{tmp_path}/cl.db"
    best = tmp_path / "cl.best.json"
    searched = autofit_cli("search", script("channels_last_cnn.py"), "--device", "cpu", "--memory-limit", "2GiB",
                           "--precision", "fp32", "--batch-range", "16:32", "--budget", "5m", "--storage", storage,
                           "--study", "cl", "--out", str(best), cwd=tmp_path, timeout=600)
    assert searched.returncode == 0, searched.stderr[-3000:]
    configs = [c for t in optuna.load_study(study_name="cl", storage=storage).trials if (c := trial_config(t))]
    tried = [c for c in configs if c.channels_last]
    assert tried and all(c.batch_size in (16, 24, 32) for c in tried)
    assert "channels-last" in searched.stderr  # its probe's label
    frame = load_study("cl", storage).trials_frame()
    assert frame["channels_last"].sum() == len(tried)
    document = json.loads(best.read_text())
    won = bool(document["config"].get("channels_last", False))
    ran = subprocess.run([sys.executable, script("channels_last_cnn.py")], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": REPO, "AUTOFIT_CONFIG": str(best)})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert f"channels_last {won}" in ran.stdout
