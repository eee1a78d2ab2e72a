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
