"""A loop that accumulates many micro-batches itself (build-nanogpt's `grad_accum_steps = total_batch_size //
(B * T)`), probed at any micro-batch and searched whatever its pilot; an fp16 start whose GradScaler skips its first
steps probed as any other (issue 52, items 1-2)."""
from __future__ import annotations

import json

import pytest

from autofit.config import Config
from autofit.probing import SCRIPT_ARGS_ENV, ProbeLimits, Worker
from tests.support import autofit_cli, script

LIMITS = ProbeLimits(120.0, 120.0, total_s=120.0)


def _probe(monkeypatch, config: Config, *args: str):
    monkeypatch.setenv(SCRIPT_ARGS_ENV, json.dumps(list(args)))
    with Worker(script("accumulates_itself.py")) as worker:
        worker.start()
        return worker.probe(config, warmup=1, steps=2, timeout=LIMITS)


@pytest.mark.slow  # a worker's start and up to 4 x 2048 micro-batches: seconds on 2 shared cores
@pytest.mark.parametrize(("total", "batch"), [(512, 1), (2048, 4)])
def test_a_loop_that_accumulates_hundreds_of_micro_batches_itself_is_probed(monkeypatch, total, batch):
    """512 a step at b=1, 2048 at b=4: 512 micro-batches with no optimizer step were NoOptimizerStep at 257."""
    result = _probe(monkeypatch, Config(batch_size=batch), "--total", str(total))
    assert result.status == "ok", result.error_message
    assert any(f"keeps its own accumulation ({total // batch} micro-batches a step)" in n for n in result.notes)
    assert any("the probe followed it to its next step" in n for n in result.notes), result.notes


@pytest.mark.slow
def test_an_fp16_start_whose_gradscaler_skips_its_first_steps_is_probed(monkeypatch):
    """40 micro-batches a step, the first 6 steps skipped by the GradScaler: 280 before the first step, an error
    that counted towards dropping fp16."""
    result = _probe(monkeypatch, Config(batch_size=4, precision="fp16"), "--total", "160", "--fp16-skips", "6")
    assert result.status == "ok", result.error_message


@pytest.mark.slow  # a search of 3 probes
def test_a_search_of_a_loop_with_2048_samples_a_step_exports_whatever_its_pilot(tmp_path):
    """Under a 4 GiB limit the pilot was b=4, 512 micro-batches a step: it failed and nothing was exported."""
    searched = autofit_cli("search", script("accumulates_itself.py"), "--device", "cpu", "--memory-limit", "4GiB",
                           "--precision", "fp32", "--trials", "3", "--budget", "10m", "--json", "--", "--total", "2048",
                           cwd=tmp_path, timeout=600)
    assert searched.returncode == 0, searched.stderr[-3000:]
    assert "NoOptimizerStep" not in searched.stderr
    assert json.loads(searched.stdout)["best"]["measured"]["samples_per_s"] > 0
