"""Distributed set-up checked directly: the ranks' log files (autofit.probing._torchrun) and the GPU-only choices of
process group and DDP (autofit.runtime._distributed) against fakes of torch.distributed."""

from __future__ import annotations

import os

import pytest
import torch

from autofit.config import Config
from tests.support import script


def test_the_ranks_log_is_private_to_its_runner_and_never_opened_through_a_link(tmp_path):
    from autofit.errors import UsageError
    from autofit.probing import DistributedWorker
    from autofit.probing._torchrun import open_log

    first, second = (DistributedWorker(script("ddp_train.py"), nproc=2) for _ in range(2))
    paths = [runner._log_file("autofit-local-0.log") for runner in (first, second)]
    assert paths[0] != paths[1]  # two runs at once: each its own file
    for path in paths:
        assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    first.close()
    assert not os.path.exists(os.path.dirname(paths[0]))
    second.close()
    logged = DistributedWorker(script("ddp_train.py"), nproc=2, log_dir=str(tmp_path / "run"))
    assert logged._log_file("autofit-local-0.log") == str(tmp_path / "run" / "autofit-local-0.log")

    victim = tmp_path / "victim.txt"
    victim.write_text("kept")
    (tmp_path / "planted.log").symlink_to(victim)
    with pytest.raises(UsageError, match="not a symbolic link"):
        open_log(str(tmp_path / "planted.log"))
    assert victim.read_text() == "kept"
    with open_log(str(tmp_path / "own.log")) as log:
        log.write("rank 0\n")
    assert os.stat(tmp_path / "own.log").st_mode & 0o777 == 0o600


def test_on_cuda_each_rank_joins_with_nccl_on_its_own_gpu(monkeypatch):
    """The GPU-only choices, with fakes of torch.distributed (no GPU here): NCCL for CUDA, gloo for CPU,
    DDP given this rank's GPU; the decorator puts rank LOCAL_RANK on cuda:LOCAL_RANK."""
    import autofit.runtime._distributed as distributed

    joined, wrapped = [], {}
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend: joined.append(backend))
    distributed.ensure_process_group(torch.device("cuda", 1))
    distributed.ensure_process_group(torch.device("cpu"))
    assert joined == ["nccl", "gloo"]

    class FakeDDP:
        def __init__(self, model, device_ids=None):
            wrapped["device_ids"] = device_ids

    class Model(torch.nn.Linear):
        def to(self, device):
            wrapped["to"] = device
            return self

    monkeypatch.setattr(distributed.torch.nn.parallel, "DistributedDataParallel", FakeDDP)
    distributed.data_parallel(Model(2, 2), torch.device("cuda", 1))
    assert wrapped == {"to": torch.device("cuda", 1), "device_ids": [1]}

    from autofit import decorator as api

    made = {}
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr("autofit.devices.make_backend", lambda kind, index: made.update(kind=kind, index=index) or
                        type("Backend", (), {"release": lambda self: None, "used_bytes": lambda self: 0,
                                             "alloc_retries": lambda self: None})())
    from autofit.normal_run import RunPlan

    fn = api.AutofitFunction(lambda run: None, api.SearchOptions())
    run = fn.make_run(plan=RunPlan(Config(batch_size=8, accumulation_steps=4), "cuda", "", None, "x.lowered.json", None))
    assert made == {"kind": "cuda", "index": 1}
    assert run.device == torch.device("cuda", 1) and run.rank == 1 and run.world_size == 2
    assert run.accumulation_steps == 2 and run.global_batch == 32 and not run.recovers_oom


def test_a_kept_groups_results_read_as_a_fresh_jobs():
    """A fresh job keeps the first failure: the rank that died leaves no result and torchrun stops the rest. A kept
    group hears from every rank: a rank whose probe's process died, the error that death caused in the other (a
    peer gone from a collective), or a rank whose probe was ended for another's failure (`aborted`)."""
    from autofit.probing import ProbeResult
    from autofit.probing._rank_group import _as_fresh_job

    config = Config(batch_size=8)
    died = ProbeResult(status="crashed", config=config, error_type="WorkerCrashed")
    peer_gone = ProbeResult(status="error", config=config, error_type="RuntimeError")
    oom = ProbeResult(status="oom", config=config)
    assert _as_fresh_job({0: peer_gone, 1: died}, set()) == {0: None, 1: None}  # RankCrashed, as a fresh job's
    assert _as_fresh_job({0: None, 1: oom}, {0}) == {0: None, 1: oom}  # the OOM stands
    assert _as_fresh_job({0: peer_gone, 1: None}, {1}) == {0: peer_gone, 1: None}  # an error of its own stands
    assert _as_fresh_job({0: None, 1: peer_gone}, set()) == {0: None, 1: None}  # rank 0 died without a reply: its consequence
