"""Batches by tokens under torchrun: every rank gets as many micro-batches and the same accumulation
toward `global_tokens` (all ranks' tokens together), so none waits on another's extra step."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support import REPO, free_port, script


def _run(tmp_path, nproc: int | None) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != "AUTOFIT_CONFIG"}
    environment.update(PYTHONPATH=REPO, AUTOFIT_DEVICE="cpu", OMP_NUM_THREADS="1",
                       WEIGHTS_OUT=str(tmp_path / f"{nproc}.pt"))
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                f"--master-port={free_port()}", "--master-addr=127.0.0.1"] if nproc else [sys.executable]
    return subprocess.run([*launcher, script("token_ddp.py")], env=environment, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)


def _ranks(output: str) -> dict[int, tuple[int, int, int]]:
    found = re.findall(r"token_ddp: rank (\d+) micro (\d+) accumulation (\d+) steps (\d+)", output)
    return {int(rank): (int(micro), int(acc), int(steps)) for rank, micro, acc, steps in found}


@pytest.mark.distributed
def test_two_ranks_take_as_many_micro_batches_and_share_the_tokens_per_step(tmp_path):
    alone = _run(tmp_path, None)
    assert alone.returncode == 0, alone.stderr[-3000:]
    together = _run(tmp_path, 2)
    assert together.returncode == 0, together.stderr[-3000:]
    ranks = _ranks(together.stdout)
    assert set(ranks) == {0, 1} and ranks[0] == ranks[1]  # the same micro-batches, accumulation and steps
    (_, one_acc, _), = _ranks(alone.stdout).values()
    two_acc = ranks[0][1]
    assert two_acc < one_acc and abs(2 * two_acc - one_acc) <= 1  # each rank holds half the step's tokens
    assert "token batches:" in together.stderr
