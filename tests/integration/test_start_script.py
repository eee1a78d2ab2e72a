"""A script without a function (`autofit.start` at module level), probed whole in a real worker process:
executed from its top with its own arguments, its steps followed, ended after the measured ones; its
out-of-memory classified as a function's; forked and persistent probes alike."""
from __future__ import annotations

import json
import re

import pytest

from autofit.config import Config
from autofit.export import MemoryBudget
from autofit.probing import SCRIPT_ARGS_ENV, ProbeLimits, Worker
from autofit.runtime import ONE_START
from tests.support import refused_by_the_allocator, script

LIMIT = 768 * 2**20


def _records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("probe_process", [pytest.param("fork", marks=pytest.mark.slow), "persistent"])  # CUDA's model by default
def test_a_start_script_is_probed_with_its_arguments_and_its_globals_fresh(tmp_path, monkeypatch, probe_process):
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv(SCRIPT_ARGS_ENV, json.dumps([f"--record={record}", "--iters", "100000"]))
    with Worker(script("starts.py"), budget=MemoryBudget(limit_bytes=LIMIT), probe_process=probe_process) as worker:
        info = worker.start()
        assert tuple(info.options["batch_range"]) == (1, 2048)  # the arguments of its autofit.start
        first = worker.probe(Config(batch_size=4), timeout=120)
        oom = worker.probe(Config(batch_size=1024), timeout=120)
        again = worker.probe(Config(batch_size=8), timeout=120)
    assert first.status == "ok" and first.measured_steps >= 5 and first.samples_per_s > 0
    assert oom.status == "oom"
    assert refused_by_the_allocator(oom.error_message) or oom.error_type == "MemoryError"
    assert again.status == "ok"
    for result in (first, oom, again):  # the script's globals (its model, its tensors) went with its probe
        assert result.memory_after_bytes - result.baseline_bytes < 128 * 2**20
    seen = _records(record)
    assert [r["batch_size"] for r in seen] == [4, 1024, 8]  # the load ran no training: no record of it
    assert all(r["argv"] == [f"--record={record}", "--iters", "100000"] for r in seen)
    assert all(r["seen"] == [r["batch_size"]] for r in seen)  # module globals fresh in every probe


def _probe_with_args(monkeypatch, args: list[str]):
    """One b=4 probe of starts.py in a fresh worker, the script handed `args`."""
    monkeypatch.setenv(SCRIPT_ARGS_ENV, json.dumps(args))
    with Worker(script("starts.py")) as worker:
        worker.start()
        return worker.probe(Config(batch_size=4), timeout=120)


def test_a_second_autofit_start_is_a_clear_error(monkeypatch):
    result = _probe_with_args(monkeypatch, ["--twice"])
    assert result.status == "error" and result.error_type == "UsageError"
    assert result.error_message == ONE_START


def test_a_script_that_ends_short_of_the_probe_is_too_short(monkeypatch):
    result = _probe_with_args(monkeypatch, ["--iters=3"])
    assert result.status == "error" and result.error_type == "ProbeTooShort"
    assert result.error_message.startswith("The script ended after 3 optimizer steps")  # a script, not a function
    assert "its own loop ended first" in result.error_message and "run.batches" not in result.error_message


@pytest.mark.slow  # a worker's start and 257 micro-batches: seconds on 2 shared cores
@pytest.mark.parametrize(("args", "status", "error_type"), [([], "diverged", "NonFiniteLoss"),
                                                           (["--finite"], "error", "NoOptimizerStep")])
def test_a_script_whose_optimizer_never_steps_ends_at_once_not_at_the_budget(monkeypatch, args, status, error_type):
    """Issue 44, item 2: a loop that skips optimizer.step() for a non-finite loss (always inf here) made micro-batches
    (progress) and no step, ran until the probe's budget was gone and came back a BudgetCut, which no budget mends."""
    monkeypatch.setenv(SCRIPT_ARGS_ENV, json.dumps(args))
    with Worker(script("never_steps.py")) as worker:
        worker.start()
        result = worker.probe(Config(batch_size=4), timeout=ProbeLimits(120.0, 120.0, total_s=120.0))
    assert (result.status, result.error_type) == (status, error_type), result.error_message
    assert re.search(r"no optimizer step closed in \d+ micro-batches", result.error_message), result.error_message
    assert "budget" not in result.error_message
