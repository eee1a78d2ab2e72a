"""Scripts run normally in fresh processes with an exported config: one process, or torchrun's ranks."""

from __future__ import annotations

import os
import subprocess
import sys

from autofit.probing import free_local_port
from tests.support import REPO, script


def config_file(path, config) -> str:
    """A best-config file at `path` holding `config` (as a search would export it), its path."""
    from autofit.export import BestConfig, write_best

    write_best(str(path), BestConfig(config=config, device={"type": "cpu"}))
    return str(path)


def run_with_config(tmp_path, name: str, config, limit: str | None = None, *, script_name: str = "longer_later.py",
                    **env: str) -> subprocess.CompletedProcess:
    """`python SCRIPT` with `config` exported, under the memory limit `limit` (none if None)."""
    best = config_file(tmp_path / f"{name}.best.json", config)
    environment = {**os.environ, "AUTOFIT_CONFIG": best, "AUTOFIT_DEVICE": "cpu", "PYTHONPATH": REPO,
                   "LOSSES_OUT": str(tmp_path / f"{name}.pt"), "AUTOFIT_RUN_REPORT": str(tmp_path / f"{name}.run.json"),
                   **env}
    environment.pop("AUTOFIT_MEMORY_LIMIT", None)
    if limit:
        environment["AUTOFIT_MEMORY_LIMIT"] = limit
    return subprocess.run([sys.executable, script(script_name)], env=environment, cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=600)


def run_ddp_train(tmp_path, name: str, nproc: int | None, *, via: str | None = None,
                  **env: str) -> subprocess.CompletedProcess:
    """ddp_train.py, under torchrun with `nproc` ranks (or as one process), through the helper
    script `via` if given."""
    environment = {**os.environ, "PYTHONPATH": REPO, "AUTOFIT_DEVICE": "cpu", "OMP_NUM_THREADS": "1",
                   "WEIGHTS_OUT": str(tmp_path / f"{name}.pt"), **env}
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                f"--master-port={free_local_port()}", "--master-addr=127.0.0.1"] if nproc else [sys.executable]
    scripts = [script(via), script("ddp_train.py")] if via else [script("ddp_train.py")]
    return subprocess.run([*launcher, *scripts], env=environment, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)


def accumulates_to_64(run, model, optimizer, width: int) -> None:
    """A kept loop that reads only run.batch_size and accumulates 64 // batch_size micro-batches itself
    (issue 44, item 3), on `model` of `width` inputs."""
    import torch

    accumulation = 64 // run.batch_size
    while True:
        for _ in range(accumulation):
            (model(torch.randn(run.batch_size, width)).pow(2).mean() / accumulation).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
