"""A GPU's costs on the CPU, searched as a GPU user would, with a short budget and no other flag:
tests/scripts/gpu_standin.py (a long start before the first step in every probe, a global batch of 480 kept by
large accumulation, a saturating device, memory that rises with the micro-batch: the search the H100 run of
nanoGPT's defaults could not finish, ../shared/gpu/2026-11-26-nanogpt-h100.md), and
tests/scripts/tokens_standin.py (a launch-bound device batched by tokens: a fixed cost per micro-batch that
dominates, memory per token small beside the limit: the H200 search of issue 43, whose cap ran at a quarter
of a fixed batch's speed), and tests/scripts/tokens_shapes.py (the same, whose first micro-batch of each new
shape costs 0.2 s more: issue 53's H200 in bf16)."""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys

import optuna
import pytest
import torch

from autofit.findings import observations
from autofit.runtime import lowered_path
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


TOKENS_LIMIT = "1600MiB"


@pytest.mark.slow
@pytest.mark.serial  # a 2m budget that holds a handful of its probes
def test_a_two_minute_token_search_of_a_launch_bound_device_exports_a_cap_near_its_memory_edge(tmp_path):
    """The exported cap is within 1.5x of the largest that fits (a probe at 1.5x it does not fit), and a whole
    epoch at it, a normal run under the same limit, trains with no OOM at least 2x the real tokens per device
    second of the safe fixed batch (the largest whose batch of the longest samples fits) at the same costs."""
    path = script("tokens_standin.py")
    searched = subprocess.run([sys.executable, "-m", "autofit.cli", "search", path, "--device", "cpu",
                               "--memory-limit", TOKENS_LIMIT, "--budget", "2m"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120 + 180)
    assert searched.returncode == 0, searched.stderr[-3000:]
    best = tmp_path / "studies" / "tokens_standin.train.cpu.best.json"
    document = json.loads(best.read_text())
    cap = document["config"]["max_tokens"]
    quick = {**os.environ, "STANDIN_START_S": "0"}
    above = subprocess.run([sys.executable, "-m", "autofit.cli", "probe", path, "--max-tokens", str(cap * 3 // 2),
                            "--memory-limit", TOKENS_LIMIT, "--json"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300, env=quick)
    result = json.loads(above.stdout)["result"]
    assert result["status"] == "oom" or result["peak_bytes"] > document["memory"]["usable_bytes"], \
        (cap, result["status"], result["peak_bytes"], searched.stderr[-3000:])
    ran = subprocess.run([sys.executable, path], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**quick, "AUTOFIT_CONFIG": str(best), "AUTOFIT_MEMORY_LIMIT": TOKENS_LIMIT})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert not os.path.exists(lowered_path(str(best)))  # no OOM: the run never lowered its config
    tokens_rate = float(re.search(r"(\d+) tokens/device-s", ran.stdout).group(1))
    standin = runpy.run_path(path, run_name="standin")
    lengths = standin["LENGTHS"]
    safe = cap * 3 // 2 // max(lengths)  # at least the safe fixed batch: its longest batch fits below 1.5x the cap
    order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(0)).tolist()
    batches = [order[i:i + safe] for i in range(0, len(order), safe)]
    fixed_s = sum(standin["step_seconds"](len(b) * max(lengths[i] for i in b)) for b in batches)
    assert tokens_rate >= 2 * sum(lengths) / fixed_s, (cap, safe, tokens_rate, sum(lengths) / fixed_s)


@pytest.mark.slow
@pytest.mark.serial  # a 2m budget that holds a handful of its probes
def test_a_two_minute_search_of_a_device_that_pays_for_each_new_shape_finds_that_padding_pays(tmp_path):
    """tests/scripts/tokens_shapes.py: the first micro-batch of each shape costs 0.2 s more (issue 53's H200 in
    bf16). The search exports a pad multiple (its probes meet new shapes as often as their epochs do, so a
    multiple reads faster), and a whole epoch at it, a normal run under the same limit, meets fewer shapes and
    trains more real tokens per device second than the same cap unpadded would (priced with the same costs)."""
    path = script("tokens_shapes.py")
    searched = subprocess.run([sys.executable, "-m", "autofit.cli", "search", path, "--device", "cpu",
                               "--memory-limit", TOKENS_LIMIT, "--budget", "2m"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120 + 180)
    assert searched.returncode == 0, searched.stderr[-3000:]
    best = tmp_path / "studies" / "tokens_shapes.train.cpu.best.json"
    config = json.loads(best.read_text())["config"]
    assert config.get("pad_multiple"), (config, searched.stderr[-3000:])
    ran = subprocess.run([sys.executable, path], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "STANDIN_START_S": "0", "AUTOFIT_CONFIG": str(best),
                              "AUTOFIT_MEMORY_LIMIT": TOKENS_LIMIT})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert not os.path.exists(lowered_path(str(best)))
    shapes, rate = re.search(r"(\d+) shapes, \d+ real tokens, (\d+) tokens/device-s", ran.stdout).groups()
    standin = runpy.run_path(path, run_name="standin")
    from autofit.runtime import TokenBatchSampler

    unpadded = TokenBatchSampler(standin["LENGTHS"], config["max_tokens"])
    seen, device_s = set(), 0.0
    for batch in unpadded:
        shape = unpadded.shape(batch)
        device_s += standin["step_seconds"](*shape, shape not in seen)
        seen.add(shape)
    assert int(shapes) < len(seen) / 2, (shapes, len(seen))
    assert float(rate) >= 1.2 * sum(standin["LENGTHS"]) / device_s, (rate, sum(standin["LENGTHS"]) / device_s)
