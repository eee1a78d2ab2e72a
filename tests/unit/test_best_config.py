"""The best-config file has one owner, both ways: `autofit.export.BestConfig` is what the search writes and what
every reader gets, and each form the file has had within schema version 1 still reads."""

from __future__ import annotations

import glob
import json
import os

import pytest

from autofit.config import SAMPLES, TOKENS, Config
from autofit.decorator import AutofitFunction
from autofit.errors import ConfigFileError
from autofit.export import (
    ABEntrant,
    ABRecord,
    BestConfig,
    MeasuredFigures,
    MemoryBudget,
    RunnerUp,
    ScriptEntry,
    StudyEntry,
    read_best,
    write_best,
)
from autofit.normal_run import resolve_run_config
from autofit.options import SearchOptions
from tests.support import REPO

#: The first form of schema 1 (autofit's first export): no ranks, allocator, A/B, ranked rate or threads.
FIRST_FORM = {
    "schema": "autofit.best-config", "schema_version": 1, "created": "2026-11-20T10:00:00+00:00", "partial": False,
    "config": {"batch_size": 32, "accumulation_steps": 2, "global_batch": 64, "precision": "fp16",
               "checkpoint_segments": 0},
    "measured": {"samples_per_s": 250.0, "tokens_per_s": None, "peak_bytes": 600_000_000, "probes": 3,
                 "confirmed": True},
    "memory": {"limit_bytes": 805306368, "headroom": 0.1, "usable_bytes": 724775731},
    "device": {"type": "cpu", "index": 0, "name": "AMD EPYC (2 cores)"},
    "versions": {"autofit": "0.1.0", "torch": "2.5.0", "cuda": None, "python": "3.11.7"},
    "script": {"path": "/abs/train.py", "function": "train", "sha256": None},
    "study": {"name": "train.train-cpu0", "storage": "sqlite:///studies/autofit.db", "probes": 9, "oom": 1,
              "failed": 0, "stopped": "the planner had nothing left worth probing"},
    "why": "fp16 b=32 acc=2: 250.0 samples/s",
    "runner_ups": [{"batch_size": 16, "accumulation_steps": 4, "global_batch": 64, "precision": "fp16",
                    "checkpoint_segments": 0, "samples_per_s": 230.0, "peak_bytes": 400_000_000}],
}


def test_the_first_form_of_the_file_reads_with_each_later_fields_default(tmp_path, monkeypatch):
    path = tmp_path / "train.train.best.json"
    path.write_text(json.dumps(FIRST_FORM))
    best = read_best(str(path))
    assert best.config == Config(batch_size=32, accumulation_steps=2, precision="fp16") and best.global_batch == 64
    assert best.world_size == 1 and best.allocator is None and best.global_tokens is None
    measured = best.measured
    assert measured.ranked_by == SAMPLES and measured.rate == 250.0 and measured.peak_bytes == 600_000_000
    assert measured.confirmed is True and measured.ab is None and measured.unconfirmed is None
    assert measured.threads is None and measured.token_envelope is None
    assert best.memory == MemoryBudget(limit_bytes=805306368, headroom=0.1, usable_bytes=724775731.0)
    assert best.script == ScriptEntry(path="/abs/train.py", function="train") and best.study.oom == 1
    assert best.runner_ups == (RunnerUp(config=Config(batch_size=16, accumulation_steps=4, precision="fp16"),
                                        rate=230.0, peak_bytes=400_000_000),)
    monkeypatch.setenv("AUTOFIT_CONFIG", str(path))  # and a normal run trains with it, unguarded, on its limit
    plan = resolve_run_config(AutofitFunction(lambda run: None, SearchOptions()), None, "cpu")
    assert plan.config == best.config and plan.searched_memory_limit == 805306368
    assert plan.token_envelope is None and plan.searched_threads is None and "unconfirmed" not in plan.message


def test_an_older_distributed_file_s_per_rank_global_batch_reads_as_the_true_one(tmp_path):
    """Files written before 2026-11-24 held each rank's micro-batch x accumulation as `global_batch`."""
    path = tmp_path / "ddp.best.json"
    path.write_text(json.dumps({**FIRST_FORM, "world_size": 2}))
    assert read_best(str(path)).global_batch == 32 * 2 * 2


def test_each_file_a_search_wrote_reads_and_writes_back_as_it_is():
    """The bundled recorded searches' files and the GPU benchmark's (one written before `ranked_by` and the A/B)."""
    paths = glob.glob(os.path.join(REPO, "autofit", "recorded", "*.best.json"))
    paths += glob.glob(os.path.join(REPO, "benchmarks", "gpu", "results", "*.best.json"))
    assert len(paths) >= 4
    for path in paths:
        with open(path) as handle:
            on_disk = json.load(handle)
        again = read_best(path).to_dict()
        if "ranked_by" not in on_disk["measured"]:  # an older file: written back with the later fields' defaults
            again, on_disk = _without_defaults(again), _without_defaults(on_disk)
        assert again == on_disk, path


def _without_defaults(document: dict) -> dict:
    """A file less what a reader takes as absent: the fields at None, samples/s as the ranked rate, one rank."""
    measured = {k: v for k, v in document["measured"].items() if v is not None and (k, v) != ("ranked_by", "samples_per_s")}
    top = {k: v for k, v in document.items() if v is not None and (k, v) != ("world_size", 1)}
    return {**top, "measured": measured}


def test_every_field_of_the_record_survives_the_file(tmp_path):
    tokens = Config(batch_size=256, max_tokens=256, precision="bf16", accumulation_steps=2)
    best = BestConfig(
        config=tokens, partial=True, global_tokens=4096, world_size=2,
        measured=MeasuredFigures(
            ranked_by=TOKENS, samples_per_s=30.0, tokens_per_s=12000.0, peak_bytes=123, probes=4, confirmed=False,
            unconfirmed="the search was interrupted", rate_from="median", rate_note="from the median",
            ab=ABRecord(entrants=(ABEntrant(label="bf16 max_tokens=256", rounds=(1.0, 2.0), median=1.5, spread=0.66),),
                        spread=0.66, led_before="bf16 max_tokens=128"),
            flops_per_sample=1e9, flops_per_token=4e6, flops_per_s=5e10, mfu=0.3, joules_per_sample=0.1,
            data_wait_share=0.2, threads=2, token_envelope={"longest_sample": 64, "padded_tokens": 256,
                                                            "padded_squares": 16384},
            profile={"matmul": 0.6}),
        memory=MemoryBudget.of(2**30, 0.1), device={"type": "cpu", "name": "cpu"},
        allocator={"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, versions={"torch": "2.13"},
        script=ScriptEntry(path="/t.py", function="train", sha256="ab" * 32, args=("--lr", "1")),
        study=StudyEntry(name="s", storage="sqlite:///x.db", probes=5, oom=1, failed=1, stopped="budget"),
        why="because", runner_ups=(RunnerUp(config=Config(batch_size=128, max_tokens=128), rate=11000.0,
                                            peak_bytes=99),))
    read = read_best(write_best(str(tmp_path / "all.best.json"), best))
    assert read == BestConfig.from_dict(best.to_dict()) and read.created and read.path
    assert read.memory.usable_bytes == int(best.memory.usable_bytes)  # the file rounds it
    assert read == BestConfig(**{**vars(best), "memory": read.memory})
    entry = read.to_dict()["config"]
    assert entry["global_batch"] is None and entry["global_tokens"] == 4096 and entry["ranks"] == 2


def test_a_file_with_a_part_that_is_not_what_the_schema_says_is_refused_with_where(tmp_path):
    path = tmp_path / "bad.best.json"
    path.write_text(json.dumps({**FIRST_FORM, "runner_ups": [{"precision": "fp8"}]}))
    with pytest.raises(ConfigFileError, match=r"must hold what its schema says, but: .*fp8"):
        read_best(str(path))
    path.write_text(json.dumps({**FIRST_FORM, "config": {"batch_size": 0}}))
    with pytest.raises(ConfigFileError, match="The config in .* must be valid"):
        read_best(str(path))
