"""nanoGPT's loop kept as it is (tests/corpus/nanogpt_original.py), converted by changing five lines
(tests/corpus/nanogpt_kept.py): probed, searched and trained with the exported config."""

from __future__ import annotations

import ast
import difflib
import json
import os
import shutil
import subprocess
import sys

import pytest

from autofit import Config
from tests.support import CORPUS, REPO, autofit_cli


def _code_lines(path: str) -> list[str]:
    """The file's lines after its module docstring (which says what was converted)."""
    text = open(path, encoding="utf-8").read()
    docstring = ast.parse(text).body[0]
    return text.splitlines()[docstring.end_lineno:]


def test_the_kept_loop_differs_from_the_original_in_five_lines():
    original, kept = _code_lines(f"{CORPUS}/nanogpt_original.py"), _code_lines(f"{CORPUS}/nanogpt_kept.py")
    changed = [line for line in difflib.unified_diff(original, kept, lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---")) and line[1:].strip()]
    added = [line for line in changed if line.startswith("+")]
    assert len(added) <= 5, "\n".join(changed)
    assert len(changed) - len(added) <= 3, "\n".join(changed)  # removed: the signature, batch and dtype lines


@pytest.mark.slow  # the default tier stays under 5 minutes on 2 cores
def test_a_probe_of_the_kept_loop_follows_its_steps(tmp_path):
    probed = autofit_cli("probe", f"{CORPUS}/nanogpt_kept.py", "--batch-size", "4", "--accumulation", "2",
                         "--precision", "bf16", "--memory-limit", "1GiB", "--json", cwd=tmp_path)
    assert probed.returncode == 0, probed.stderr[-3000:]
    result = json.loads(probed.stdout)["result"]
    assert result["status"] == "ok", result
    assert result["measured_steps"] >= Config.from_dict(result["config"]).probe_steps(5) and result["samples_per_s"] > 0
    assert {k: result["knobs"][k] for k in ("followed", "batches", "backward", "autocast")} == dict.fromkeys(
        ("followed", "batches", "backward", "autocast"), True)
    assert result["flops_per_sample"] > 0  # the FLOP count follows the loop too


@pytest.mark.slow
def test_the_kept_loop_is_searched_and_its_normal_run_trains_with_the_exported_config(tmp_path):
    shutil.copy(f"{CORPUS}/nanogpt_kept.py", tmp_path)
    searched = autofit_cli("search", "nanogpt_kept.py", "--memory-limit", "1GiB", "--budget", "10m", "--trials", "3",
                           "--batch-range", "4:16", "--storage", f"sqlite:///{tmp_path}/k.db", cwd=tmp_path,
                           timeout=900)
    assert searched.returncode == 0, searched.stderr[-3000:]
    best = json.load(open(tmp_path / "nanogpt_kept.train.cpu.best.json"))
    config = best["config"]
    assert config["global_batch"] == 16 and config["batch_size"] * config["accumulation_steps"] == 16
    ran = subprocess.run([sys.executable, "nanogpt_kept.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": REPO})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "following your loop's optimizer steps" in ran.stderr
    label = f"b={config['batch_size']}"
    assert f"trained 301 optimizer steps with {config['precision']} {label}" in ran.stderr, ran.stderr[-2000:]
    dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[config["precision"]]
    assert f", {dtype}" in ran.stdout  # the loop's own dtype line followed the exported precision
