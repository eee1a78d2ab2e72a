"""The allocator in the config (issue 51, item 4): a CUDA search's probes and a normal run on CUDA run with
expandable segments unless the user set the allocator (PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF); either way
the best-config file records what the probes ran under, and a normal run applies what the file records. The file
also carries the winner's allocator retries and the pinned host memory its probes held."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from autofit.config import Config
from autofit.decorator import AutofitFunction
from autofit.devices import DEFAULT_CUDA_ALLOC_CONF, apply_allocator_settings
from autofit.export import BestConfig, read_best, write_best
from autofit.findings import best_document
from autofit.normal_run import resolve_run_config
from autofit.options import SearchOptions
from autofit.planner import SearchSpace
from autofit.probing import ProbeResult
from autofit.search import SearchSettings
from tests.support.studies import study_of

EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "PYTORCH_ALLOC_CONF": None}


@pytest.fixture(autouse=True)
def unset(monkeypatch):
    """The user set no allocator settings; what a test (or a run it makes) sets is taken back after it."""
    for name in EXPANDABLE:
        monkeypatch.setenv(name, "")  # recorded, so that the teardown restores the variable as it was
        monkeypatch.delenv(name)


def _recorded(tmp_path, search: SearchSettings) -> str:
    """A best-config file of what `search`'s probes ran under, as its session records them."""
    from autofit.devices import current_allocator_settings

    return write_best(str(tmp_path / "best.json"), BestConfig(
        config=Config(batch_size=8), device={"type": "cpu", "name": "the CPU this test runs on"},
        allocator=current_allocator_settings(search.alloc_conf)))


def test_a_cuda_search_runs_its_probes_with_expandable_segments_unless_the_user_set_the_allocator(monkeypatch):
    assert DEFAULT_CUDA_ALLOC_CONF == "expandable_segments:True"
    assert SearchSettings(script="train.py", device="cuda").alloc_conf == DEFAULT_CUDA_ALLOC_CONF
    assert SearchSettings(script="train.py", device="cpu").alloc_conf is None  # nothing to set on a CPU
    given = SearchSettings(script="train.py", device="cuda", alloc_conf="garbage_collection_threshold:0.6")
    assert given.alloc_conf == "garbage_collection_threshold:0.6"  # --alloc-conf
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "backend:cudaMallocAsync")
    assert SearchSettings(script="train.py", device="cuda").alloc_conf is None  # the user's own: inherited


def test_the_exported_file_records_the_allocator_settings_and_a_normal_run_applies_them(tmp_path):
    path = _recorded(tmp_path, SearchSettings(script="train.py", device="cuda"))
    assert read_best(path).allocator == EXPANDABLE  # the round trip
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # applied: nothing differs, nothing to warn
        resolve_run_config(AutofitFunction(lambda run: None, SearchOptions()), path, "cpu")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_the_users_own_settings_stand_in_a_normal_run_and_it_is_told_they_differ(tmp_path, monkeypatch):
    path = _recorded(tmp_path, SearchSettings(script="train.py", device="cuda"))
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.6")
    with pytest.warns(UserWarning, match="PYTORCH_CUDA_ALLOC_CONF was expandable_segments:True in the search and "
                                         "is garbage_collection_threshold:0.6 now"):
        resolve_run_config(AutofitFunction(lambda run: None, SearchOptions()), path, "cpu")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "garbage_collection_threshold:0.6"


def test_a_file_that_recorded_none_runs_as_its_search_did_and_no_file_runs_with_the_default_on_cuda():
    assert apply_allocator_settings({"PYTORCH_CUDA_ALLOC_CONF": None, "PYTORCH_ALLOC_CONF": None}, "cuda") is None
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ  # the search ran under torch's own: so does the run
    apply_allocator_settings(None, "cpu")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
    apply_allocator_settings(None, "cuda")  # no file, or one from before the record
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == DEFAULT_CUDA_ALLOC_CONF


def test_where_cuda_already_started_the_settings_are_set_in_its_allocator(monkeypatch):
    """A script that touched CUDA at import started its allocator before the run read the file."""
    set_to: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", set_to.append, raising=False)
    assert apply_allocator_settings(EXPANDABLE, "cuda") is None
    assert set_to == ["expandable_segments:True"]

    def refuses(value: str) -> None:
        raise RuntimeError("CUDA allocator backend cannot be changed once set\nmore")

    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", refuses, raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")  # set by the call before
    said = apply_allocator_settings({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, "cuda")
    assert said == ("backend:cudaMallocAsync could not be set once CUDA had started (CUDA allocator backend cannot "
                    "be changed once set)")


def _ok(batch: int, rate: float, retries: int | None, pinned: int | None = None) -> ProbeResult:
    return ProbeResult(status="ok", config=Config(batch_size=batch), samples_per_s=rate, peak_bytes=2**30,
                       step_time_median_s=1.0, step_time_iqr_s=0.02, alloc_retries=retries,
                       allocator={"host_pinned_peak_bytes": pinned} if pinned is not None else {})


def test_the_file_carries_its_winners_retries_and_pinned_host_memory_and_they_round_trip(tmp_path):
    space = SearchSpace.build(batch_range=(1, 64), precision=("fp32",))
    winner = best_document(study_of([_ok(8, 100.0, 0), _ok(16, 200.0, 0, 3 * 2**30), _ok(16, 190.0, 2, 2**30)],
                                    space, (1, 64)), "sqlite:///x.db", stopped="done", partial=False)
    assert (winner.measured.alloc_retries, winner.measured.host_pinned_bytes) == (2, 3 * 2**30)
    assert read_best(write_best(str(tmp_path / "best.json"), winner)).measured == winner.measured
    uncounted = best_document(study_of([_ok(16, 200.0, None)], space, (1, 64)), "sqlite:///x.db", stopped="done",
                              partial=False).to_dict()["measured"]
    assert "alloc_retries" not in uncounted and "host_pinned_bytes" not in uncounted  # a CPU's: left out
