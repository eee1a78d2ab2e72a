"""A normal run by tokens whose data holds samples longer than any the search's probes ran: with the
best-config file's envelope, the micro-batches beyond it run in pieces (one micro-step each: the steps,
their losses and the final weights are the unsplit run's to 1e-5), and the end line and the JSON report
say how many."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from autofit import Config
from autofit.export import BestConfig, MeasuredFigures, write_best
from autofit.runtime import TokenEnvelope
from tests.support import REPO, script

CONFIG = Config(batch_size=64, max_tokens=64, accumulation_steps=2)
# What probes of data up to 16 tokens ran at this cap: 4 x 16 padded tokens, 4 x 16² padded squares. The
# script's three 32-token samples come as [32, 32] and [32, 16], each 2 x 32² = 2048 squares: beyond.
ENVELOPE = TokenEnvelope(longest_sample=16, padded_tokens=64, padded_squares=1024)


def _run(tmp_path, name: str, envelope: TokenEnvelope | None) -> tuple[subprocess.CompletedProcess, dict]:
    measured = MeasuredFigures(token_envelope=envelope.to_dict() if envelope else None)
    path = write_best(str(tmp_path / f"{name}.best.json"), BestConfig(config=CONFIG, measured=measured,
                                                                      device={"type": "cpu", "name": "cpu"}))
    environment = {key: value for key, value in os.environ.items() if key != "AUTOFIT_OOM_RECOVERY"}
    environment.update(PYTHONPATH=REPO, AUTOFIT_DEVICE="cpu", AUTOFIT_CONFIG=path, OMP_NUM_THREADS="1",
                       AUTOFIT_RUN_REPORT=str(tmp_path / f"{name}.json"), WEIGHTS_OUT=str(tmp_path / f"{name}.pt"))
    ran = subprocess.run([sys.executable, script("token_guard.py")], env=environment, capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return ran, json.loads((tmp_path / f"{name}.json").read_text())


def _losses(stdout: str) -> torch.Tensor:
    return torch.tensor([float(v) for v in re.search(r"token_guard: losses (.*)", stdout).group(1).split()])


def _forwards_and_steps(stdout: str) -> tuple[int, int]:
    forwards, steps = re.search(r"token_guard: forwards (\d+) steps (\d+)", stdout).groups()
    return int(forwards), int(steps)


@pytest.mark.slow  # the default tier stays under 5 minutes on 2 cores
def test_batches_beyond_the_probes_run_in_pieces_and_train_as_the_whole_ones(tmp_path):
    whole, whole_report = _run(tmp_path, "whole", None)
    split, split_report = _run(tmp_path, "split", ENVELOPE)
    assert (split_report["guard_split_batches"], split_report["oom_split_batches"]) == (2, 0)
    assert whole_report["guard_split_batches"] == 0
    assert "micro-batches run in pieces: 2 beyond what the probes ran (token guard)" in split.stderr
    assert "micro-batches run in pieces" not in whole.stderr
    whole_forwards, whole_steps = _forwards_and_steps(whole.stdout)
    assert _forwards_and_steps(split.stdout) == (whole_forwards + 2, whole_steps)  # each in 2 pieces, as 1 micro-step
    assert split_report["config"] == whole_report["config"] == CONFIG.to_dict()  # accumulation unchanged
    assert torch.allclose(_losses(split.stdout), _losses(whole.stdout), atol=1e-5, rtol=0)
    split_weights, whole_weights = torch.load(tmp_path / "split.pt"), torch.load(tmp_path / "whole.pt")
    for name, weight in whole_weights.items():
        assert torch.allclose(split_weights[name], weight, atol=1e-5, rtol=0), name
