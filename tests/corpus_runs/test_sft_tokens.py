"""The SFT corpus script batches by tokens (`run.token_batches`): a short search under a memory limit
climbs `max_tokens` from the longest sample up and exports the cap, and the script run normally with the
file, under the limit it was searched under, trains a whole epoch (its longest samples included) with no
OOM and reports its padding share."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from autofit import Config
from tests.support import CORPUS, REPO, autofit_cli

SCRIPT = os.path.join(CORPUS, "sft_tokens.py")


@pytest.mark.slow
def test_a_search_exports_max_tokens_and_a_normal_epoch_runs_under_the_limit(tmp_path):
    searched = autofit_cli("search", SCRIPT, "--device", "cpu", "--memory-limit", "768MiB", "--precision", "fp32",
                           "--trials", "5", "--budget", "3m", cwd=tmp_path, timeout=900)
    assert searched.returncode == 0, searched.stderr[-3000:]
    assert "max_tokens=" in searched.stderr  # the probes were sized by tokens
    assert "real (non-padding) tokens/s" in searched.stdout + searched.stderr
    best = tmp_path / "studies" / "sft_tokens.train.cpu.best.json"
    document = json.loads(best.read_text())
    config = Config.from_dict(document["config"])
    assert config.max_tokens is not None and config.max_tokens >= 256  # at least the longest sample
    assert document["config"]["max_tokens"] == config.max_tokens
    assert document["measured"]["peak_bytes"] <= document["memory"]["usable_bytes"]
    envelope = document["measured"]["token_envelope"]  # what the winner's probes ran: the longest batch first
    assert envelope["longest_sample"] == 256 and envelope["padded_tokens"] <= config.max_tokens
    assert envelope["padded_squares"] >= (config.max_tokens // 256) * 256**2

    environment = {key: value for key, value in os.environ.items() if key != "AUTOFIT_CONFIG"}
    ran = subprocess.run([sys.executable, SCRIPT], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                         env={**environment, "PYTHONPATH": REPO, "AUTOFIT_DEVICE": "cpu",
                              "AUTOFIT_MEMORY_LIMIT": "json", "AUTOFIT_OOM_RECOVERY": "0",
                              "AUTOFIT_RUN_REPORT": str(tmp_path / "run.json")})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert f"with the best config from studies/{best.name}: {config.label()}" in ran.stderr
    assert "sft_tokens: done" in ran.stdout  # the epoch ended: every batch, the longest ones too
    assert "token batches:" in ran.stderr and "padding (longest 256 tokens)" in ran.stderr
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["config"]["max_tokens"] == config.max_tokens and not report["lowerings"]
    assert 0 < report["padding_share"] < 0.5 and report["tokens_per_s"]
    # the same data as the probes': no batch lies beyond their envelope
    assert (report["guard_split_batches"], report["oom_split_batches"]) == (0, 0)
    assert "micro-batches run in pieces" not in ran.stderr


@pytest.mark.slow
def test_a_probe_by_tokens_reports_the_longest_sample_and_real_tokens(tmp_path):
    probed = autofit_cli("probe", SCRIPT, "--device", "cpu", "--memory-limit", "1GiB", "--max-tokens", "2048",
                         "--json", cwd=tmp_path)
    assert probed.returncode == 0, probed.stderr[-3000:]
    result = json.loads(probed.stdout)["result"]
    assert result["config"]["max_tokens"] == 2048 and result["knobs"]["longest_sample"] == 256
    assert result["knobs"]["token_envelope"]["longest_sample"] == 256  # the batch that holds it ran first
    assert 0 < result["tokens_per_s"] and result["samples_per_s"] < result["tokens_per_s"]
    refused = autofit_cli("probe", SCRIPT, "--device", "cpu", "--batch-size", "4096", "--max-tokens", "2048",
                          cwd=tmp_path)
    assert refused.returncode != 0 and "at most the max tokens" in refused.stderr
