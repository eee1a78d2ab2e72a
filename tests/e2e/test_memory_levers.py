"""Where memory binds, checkpointing must pay (issue 51): tests/scripts/memory_standin.py (a deep stack of Llama-style
blocks whose saved activations dominate, offered to run.checkpoint, with a fixed cost per micro-batch as a launch-bound
GPU has) searched as a user would, under a cap where plain fits only at micro-batch 8. Before rule 12 a 2-minute search
of it spent 2 of its 7 probes on configs that did not fit (plain b=12, b=16 with 6 selective blocks) and exported b=12
with 6 selective blocks at 1.33x the best plain config (a 4-minute one: 6 of 13, b=16 with 12 blocks at 1.57x); every
block checkpointed runs 2.6x it at b=48 (docs/benchmarks.md, "Where memory binds")."""

from __future__ import annotations

import json
import subprocess
import sys

import optuna
import pytest

from autofit.study import open_storage, trial_result
from tests.support import script

LIMIT = "700MiB"


@pytest.mark.slow
@pytest.mark.serial  # a 2-minute budget that holds a handful of its probes
def test_a_two_minute_search_of_a_memory_bound_model_reaches_a_checkpointed_config_that_beats_its_best_plain_one(
        tmp_path):
    """Exit 0; at most one probe of a config that does not fit (out of memory, or a peak inside the headroom); the
    exported config checkpoints blocks, and its figure is at least 1.2x the fastest config without checkpointing
    that the search measured."""
    ran = subprocess.run([sys.executable, "-m", "autofit.cli", "search", script("memory_standin.py"), "--device", "cpu",
                          "--memory-limit", LIMIT, "--budget", "2m"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120 + 180)
    assert ran.returncode == 0, ran.stderr[-3000:]
    best = json.loads((tmp_path / "studies" / "memory_standin.train.cpu.best.json").read_text())
    usable = best["memory"]["usable_bytes"]
    study = optuna.load_study(study_name="memory_standin.train-cpu0",
                              storage=open_storage(f"sqlite:///{tmp_path}/studies/autofit.db"))
    results = [r for r in map(trial_result, study.trials) if r is not None]
    too_big = [r.config.label() for r in results if r.status == "oom" or (r.ok and (r.peak_bytes or 0) > usable)]
    assert len(too_big) <= 1, (too_big, ran.stderr[-3000:])
    plain = max((r.samples_per_s for r in results if r.ok and not r.config.checkpoint_segments
                 and (r.peak_bytes or 0) <= usable), default=None)
    assert plain is not None, ran.stderr[-3000:]
    assert best["config"]["checkpoint_segments"] > 0, ran.stderr[-3000:]
    assert best["measured"]["samples_per_s"] >= 1.2 * plain, (best["measured"], plain, ran.stderr[-3000:])
