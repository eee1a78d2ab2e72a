"""Batches by tokens under torchrun: every rank gets as many micro-batches and the same accumulation
toward `global_tokens` (all ranks' tokens together), so none waits on another's extra step; the token
guard's pieces, as many or as few on each rank, keep the ranks in step."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from autofit import Config
from autofit.export import BestConfig, MeasuredFigures, write_best
from autofit.runtime import TokenEnvelope
from autofit.probing import free_local_port
from tests.support import REPO, script


def _run(tmp_path, nproc: int | None, config_path: str | None = None, name: str | None = None
         ) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != "AUTOFIT_CONFIG"}
    environment.update(PYTHONPATH=REPO, AUTOFIT_DEVICE="cpu", OMP_NUM_THREADS="1",
                       WEIGHTS_OUT=str(tmp_path / f"{name or nproc}.pt"),
                       **({"AUTOFIT_CONFIG": config_path} if config_path else {}))
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                f"--master-port={free_local_port()}", "--master-addr=127.0.0.1"] if nproc else [sys.executable]
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


def _file(tmp_path, name: str, envelope: TokenEnvelope | None) -> str:
    return write_best(str(tmp_path / f"{name}.best.json"), BestConfig(
        config=Config(batch_size=64, max_tokens=64), world_size=2,
        measured=MeasuredFigures(token_envelope=envelope.to_dict() if envelope else None),
        device={"type": "cpu", "name": "cpu"}))


@pytest.mark.distributed
def test_pieces_on_one_rank_and_not_the_other_keep_the_ranks_in_step_and_the_gradients_whole(tmp_path):
    """Probes that drew no sample past 20 tokens: at a cap of 64 the data's batches of two samples of 21-32
    tokens run in pieces, at different places on the two ranks (the first micro-batch: one rank's in two
    pieces, the other's whole). DDP synchronises each rank once per micro-batch all the same."""
    whole = _run(tmp_path, 2, _file(tmp_path, "whole", None), "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    split = _run(tmp_path, 2, _file(tmp_path, "split", TokenEnvelope(20, 64, 800)), "split")
    assert split.returncode == 0, split.stderr[-3000:]
    whole_ranks, split_ranks = _ranks(whole.stdout), _ranks(split.stdout)
    for rank in (0, 1):
        micro, accumulation, steps = split_ranks[rank]
        assert (accumulation, steps) == whole_ranks[rank][1:] == whole_ranks[1 - rank][1:]
        assert micro > whole_ranks[rank][0]  # its own pieces, more forward passes than micro-batches
    assert split_ranks[0][0] != split_ranks[1][0]  # as many micro-steps, not as many pieces
    assert "2 beyond what the probes ran (token guard)" not in whole.stderr
    assert re.search(r"micro-batches run in pieces: \d+ beyond what the probes ran", split.stderr)
    split_weights, whole_weights = torch.load(tmp_path / "split.pt"), torch.load(tmp_path / "whole.pt")
    for name, weight in whole_weights.items():
        assert torch.allclose(split_weights[name], weight, atol=1e-5, rtol=0), name
