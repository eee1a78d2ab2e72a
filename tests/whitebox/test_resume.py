"""A search that resumes its study with another version of the script (issue 44) says so in one line, keeps
the old probes (unranked), and forgets what the old version taught: the knobs its function offers and the
memory estimator's answers."""

from __future__ import annotations

from dataclasses import replace

from autofit import Config
from autofit.export import MemoryBudget
from autofit.planner import SearchSpace
from autofit.probing import ProbeResult, RecordedVersion
from autofit.search._resume import open_study
from autofit.study import ESTIMATES_ATTR, keep_meta, script_trials, study_meta
from tests.support.studies import study_of

GiB = 2**30
OLD, NEW = "a" * 64, "b" * 64


def test_resuming_with_another_version_of_the_script_says_so_and_forgets_what_the_old_one_taught():
    results = [ProbeResult(status="ok", config=Config(batch_size=b), samples_per_s=100.0, peak_bytes=GiB,
                           step_time_median_s=1.0, wall_s=1.0) for b in (8, 16)]
    study = study_of(results, SearchSpace.build(batch_range=(1, 64), precision=("fp32",)), (1, 64), stamps=[OLD, OLD])
    keep_meta(study, replace(study_meta(study), script_sha256=OLD, knobs={"batches": True}))
    study.set_user_attr(ESTIMATES_ATTR, {"asked": 3})

    def resume(sha256: str) -> list[str]:
        return open_study(study._storage, study.study_name, fresh=False, device_name="cpu",
                          budget=MemoryBudget.of(8 * GiB, 0.1), limit_given=True,
                          version=RecordedVersion(sha256=sha256, name="train.py")).notes

    assert resume(OLD) == [] and study_meta(study).knobs == {"batches": True}
    assert resume(NEW) == ["the script changed (train.py): 2 of this study's probes ran another version of it; they are kept "
                           "but not ranked, and their configs are probed again (--fresh drops them)"]
    assert study_meta(study).knobs is None and study.user_attrs[ESTIMATES_ATTR] is None
    assert len(script_trials(study, OLD)) == 2  # kept


def _resumed_with(study, budget: MemoryBudget, limit_given: bool, **others) -> str:
    import pytest

    from autofit.errors import UsageError

    with pytest.raises(UsageError) as refused:
        open_study(study._storage, study.study_name, fresh=False, device_name="cpu", budget=budget,
                   limit_given=limit_given, version=None, **others)
    return str(refused.value)


def test_a_resume_under_another_limit_speaks_in_the_options_words_and_units():
    """Issue 54: it said "the same limit bytes (22284488704), but got 1072668082176": raw bytes, an internal
    field's name, and a first search that had set no limit."""
    study = study_of([], SearchSpace.build(batch_range=(1, 64), precision=("fp32",)), (1, 64))
    keep_meta(study, replace(study_meta(study), limit_given=False))  # the first search gave no --memory-limit
    said = _resumed_with(study, MemoryBudget.of(999 * GiB, 0.1), limit_given=True)
    assert ("must be resumed with the same memory limit (none given, so the 8.00 GiB free when it began), but "
            "got --memory-limit 999.00 GiB: search with the same memory limit to resume it, pass --fresh") in said
    keep_meta(study, replace(study_meta(study), limit_given=True))
    said = _resumed_with(study, MemoryBudget.of(20 * GiB, 0.1), limit_given=False)
    assert "the same memory limit (--memory-limit 8.00 GiB), but got none given, so the 20.00 GiB free now" in said
    said = _resumed_with(study, MemoryBudget.of(8 * GiB, 0.2), limit_given=True)
    assert "the same headroom (--headroom 0.1), but got --headroom 0.2" in said
    said = _resumed_with(study, MemoryBudget.of(8 * GiB, 0.1), limit_given=True, world_size=2)
    assert "the same ranks per probe (1: --nproc-per-node x --nnodes), but got 2" in said
    assert "bytes" not in said and "_" not in said.split(": pass")[0].replace(study.study_name, "")
