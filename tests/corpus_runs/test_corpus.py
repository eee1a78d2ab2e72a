"""The corpus (tests/corpus/): training scripts in the styles of widely used public examples, each
with only the change autofit documents. For each: a probe is ok, a search bounded by its probe count
under a CPU memory limit exports a config, the script run normally (`python script.py`, the exported
file found in the working directory's studies/) trains to the end with it, and the memory estimator
answers for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from autofit.config import Config
from autofit.export import MemoryBudget
from autofit.probing import free_local_port
from tests.support import CORPUS, REPO, autofit_cli


@dataclass(frozen=True)
class Entry:
    """One corpus script: how to probe it, how tight a limit to search it under, its test tier."""

    name: str
    function: str
    probe: tuple[str, ...]  # `autofit probe` arguments for a config that fits
    limit: str
    tier: str | None  # pytest marker of the search and run (None: slow)
    nproc: int = 1

    @property
    def path(self) -> str:
        return os.path.join(CORPUS, f"{self.name}.py")

    def marks(self) -> list:
        return [getattr(pytest.mark, self.tier or "slow")]


ENTRIES = [
    Entry("word_language_model", "main", ("--batch-size", "20"), "1GiB", None),
    Entry("mnist_cnn", "main", ("--batch-size", "64"), "1GiB", None),
    Entry("dcgan", "train", ("--batch-size", "64"), "1GiB", None),
    Entry("nanogpt_train", "train", ("--batch-size", "8", "--accumulation", "2"), "1GiB", None),
    Entry("hf_trainer_clm", "main", ("--batch-size", "8", "--accumulation", "2"), "1536MiB", "frameworks"),
    Entry("lightning_tied", "main", ("--batch-size", "16", "--accumulation", "2", "--checkpoint", "2"), "1536MiB",
          "frameworks"),
    Entry("ddp_converted", "main", ("--batch-size", "16", "--accumulation", "2"), "1GiB", "distributed", nproc=2),
    Entry("moe", "train", ("--batch-size", "32", "--checkpoint", "1"), "1GiB", None),
    Entry("late_device", "train", ("--batch-size", "32", "--checkpoint", "1"), "1GiB", None),
]


def _params():
    return [pytest.param(entry, id=entry.name, marks=entry.marks()) for entry in ENTRIES]


def _ranks(entry: Entry) -> tuple[str, ...]:
    return ("--nproc-per-node", str(entry.nproc)) if entry.nproc > 1 else ()


def _environment(tmp_path) -> dict[str, str]:
    return {"HF_OUT": str(tmp_path / "hf_out"), "PL_OUT": str(tmp_path / "pl_out"), "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("entry", [p for p in _params() if p.values[0].nproc > 1])
def test_a_probe_is_ok(entry, tmp_path):
    """A probe from the command line on the entry's ranks. One rank's entries are probed by their search
    (test_a_search_exports_a_config_the_normal_run_trains_with) and at the entry's knobs in one process
    (test_probes_in_one_process_are_ok): this probe was their third, and CI's 60 minutes could not hold it."""
    probed = autofit_cli("probe", entry.path, "--device", "cpu", "--memory-limit", "2GiB", *entry.probe,
                         *_ranks(entry), "--json", cwd=tmp_path, env=_environment(tmp_path))
    assert probed.stdout, probed.stderr[-3000:]
    result = json.loads(probed.stdout)["result"]
    assert probed.returncode == 0 and result["status"] == "ok", (result["error_message"], result["traceback"])
    assert result["samples_per_s"] > 0 and result["measured_steps"] >= Config.from_dict(result["config"]).probe_steps(5)
    assert result["world_size"] == entry.nproc
    assert result["knobs"]["batches"]  # it went through run.batches() or the framework's loop


def _config(arguments: tuple[str, ...], **changes) -> Config:
    """The Config of `autofit probe` arguments (--batch-size, --accumulation, --checkpoint)."""
    given = dict(zip(arguments[::2], arguments[1::2]))
    fields = {"batch_size": int(given["--batch-size"]), "accumulation_steps": int(given.get("--accumulation", 1)),
              "checkpoint_segments": int(given.get("--checkpoint", 0))}
    return Config(**{**fields, **changes})


@pytest.mark.parametrize("entry", [p for p in _params() if p.values[0].nproc == 1])
def test_probes_in_one_process_are_ok(entry, tmp_path, monkeypatch):
    """CUDA's process model on the CPU: the entry's config, then the same without checkpointing and at
    half the micro-batch (the global batch kept), one after the other in one process, each as a probe in a
    fresh process would be."""
    from autofit.probing import Worker

    for name, value in _environment(tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    first = _config(entry.probe)
    second = _config(entry.probe, checkpoint_segments=0, batch_size=first.batch_size // 2,
                     accumulation_steps=first.accumulation_steps * 2)
    with Worker(entry.path, budget=MemoryBudget(limit_bytes=2 * 2**30), probe_process="persistent") as worker:
        results = [worker.probe(config, timeout=300) for config in (first, second)]
    for result in results:
        assert result.status == "ok", (result.config.label(), result.error_message, result.traceback)
        assert result.samples_per_s > 0 and result.knobs["batches"]
    assert results[0].knobs == results[1].knobs


@pytest.mark.parametrize("entry", _params())
def test_a_search_exports_a_config_the_normal_run_trains_with(entry, tmp_path):
    # --budget 3m: three probes and their A/B fit well inside; the estimator, whose share of the budget this
    # bounds, is tested on its own (test_the_estimator_answers)
    env = _environment(tmp_path)
    searched = autofit_cli("search", entry.path, "--device", "cpu", "--memory-limit", entry.limit,
                           "--trials", "3", "--budget", "3m", *_ranks(entry), cwd=tmp_path, env=env, timeout=600)
    assert searched.returncode == 0, searched.stderr[-3000:]
    best = tmp_path / "studies" / f"{entry.name}.{entry.function}.cpu.best.json"
    document = json.loads(best.read_text())
    config = Config.from_dict(document["config"])
    assert document["world_size"] == entry.nproc
    assert document["measured"]["peak_bytes"] <= document["memory"]["usable_bytes"]

    # Run as it will be run: from the same working directory, which holds studies/ with the file.
    launcher = [sys.executable] if entry.nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={entry.nproc}",
        f"--master-port={free_local_port()}", "--master-addr=127.0.0.1"]
    environment = {key: value for key, value in os.environ.items() if key != "AUTOFIT_CONFIG"}
    ran = subprocess.run([*launcher, entry.path], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**environment, "PYTHONPATH": REPO, "AUTOFIT_DEVICE": "cpu", **env})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert f"with the best config from studies/{best.name}: {config.label()}" in ran.stderr
    assert f"optimizer steps with {config.label()}" in ran.stderr  # the run's own report: it trained to the end
    assert f"{entry.name}:" in ran.stdout  # the script's own last line, after its training loop


@pytest.mark.slow
@pytest.mark.parametrize("entry", [pytest.param(entry, id=entry.name) for entry in ENTRIES])
def test_the_estimator_answers(entry, tmp_path):
    estimated = autofit_cli("estimate", entry.path, "--memory-limit", "2GiB", "--json", cwd=tmp_path,
                            env=_environment(tmp_path))
    assert estimated.returncode == 0, estimated.stderr[-2000:]
    fits = json.loads(estimated.stdout)["fits"]
    assert fits and fits[0]["config"] is not None
