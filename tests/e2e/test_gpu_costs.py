"""A GPU's costs on the CPU (tests/scripts/gpu_standin.py: a long start before the first step in every probe,
a global batch of 480 kept by large accumulation, a saturating device, memory that rises with the
micro-batch), searched as a GPU user would, with a short budget and no other flag: the search the H100 run
of nanoGPT's defaults could not finish (../shared/gpu/2026-11-26-nanogpt-h100.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import optuna
import pytest

from autofit.findings import observations
from autofit.study import open_storage, trial_result
from tests.support import script

BUDGET_S = 180


@pytest.mark.slow
@pytest.mark.serial
def test_a_three_minute_search_measures_four_configs_without_a_timeout(tmp_path):
    """Exit 0; at least 4 configs measured; no timeout; a pilot that is not the smallest micro-batch; probes
    of a long accumulation priced from 4 micro-batches a step; a confirmation of at most a quarter of the
    budget."""
    ran = subprocess.run([sys.executable, "-m", "autofit.cli", "search", script("gpu_standin.py"), "--device", "cpu",
                          "--memory-limit", "1GiB", "--budget", f"{BUDGET_S}s"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=BUDGET_S + 120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    storage = f"sqlite:///{tmp_path}/studies/autofit.db"
    study = optuna.load_study(study_name="gpu_standin.train-cpu0", storage=open_storage(storage))
    results = [(t, trial_result(t)) for t in study.trials]
    measured = {r.config for _, r in results if r is not None and r.ok}
    assert len(measured) >= 4, sorted(c.label() for c in measured)
    assert not [r for _, r in results if r is not None and r.status == "timeout"]
    pilot = results[0][1].config
    assert pilot.batch_size > 1 and pilot.accumulation_steps < 480
    long = [r for _, r in results if r is not None and r.ok and r.config.accumulation_steps > 4]
    assert long and all(r.probe_accumulation == 4 for r in long)
    confirmation = sum(r.wall_s for t, r in results if r is not None and t.user_attrs.get("phase") == "confirm")
    assert confirmation <= BUDGET_S / 4
    seen = observations(study.trials)
    assert any(o.status == "ok" for o in seen)
    best = json.loads((tmp_path / "studies" / "gpu_standin.train.cpu.best.json").read_text())
    assert best["config"]["global_batch"] == 480


@pytest.mark.slow
def test_a_normal_run_with_no_file_trains_at_the_scripts_own_batch(tmp_path):
    """Before any search, `python train.py` trains at what the script had (12 x 40), never at the whole
    global batch as one micro-batch (which ran nanoGPT's defaults out of memory on an H100)."""
    env = {**os.environ, "STANDIN_START_S": "0", "STANDIN_ITERS": "2", "STANDIN_LAUNCH_S": "0.001",
           "STANDIN_SAMPLE_S": "0"}
    env.pop("AUTOFIT_CONFIG", None)
    ran = subprocess.run([sys.executable, script("gpu_standin.py")], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "running with defaults: fp32 b=12 acc=40" in ran.stderr
    assert "trained 2 optimizer steps with fp32 b=12 acc=40" in ran.stderr
