"""Probes carry the script they ran (issue 44): a study searched again after its script changed ranks and
exports only the probes of the script it names (the best file's sha256 is the one its figures were measured
under), and a study recorded before probes carried their script reads them as the study's script then.
Resuming with another version: tests/whitebox/test_resume.py."""

from __future__ import annotations

from dataclasses import replace

import optuna

from autofit import Config
from autofit.findings import StoredStudy, best_document
from autofit.planner import SearchSpace
from autofit.probing import ProbeResult
from autofit.study import SCRIPT_ATTR, keep_meta, other_script_probes, script_trials, study_meta
from tests.support.studies import study_of

GiB = 2**30
OLD, NEW = "a" * 64, "b" * 64


def _ok(batch: int, rate: float) -> ProbeResult:
    return ProbeResult(status="ok", config=Config(batch_size=batch), samples_per_s=rate, peak_bytes=batch * 2**20,
                       step_time_median_s=1.0, step_time_iqr_s=0.02, wall_s=1.0)


def _study(results: list[ProbeResult], stamps: list[str | None], script_sha256: str) -> optuna.Study:
    study = study_of(results, SearchSpace.build(batch_range=(1, 64), precision=("fp32",)), (1, 64), stamps=stamps)
    study.set_user_attr("autofit", {**study.user_attrs["autofit"], "script_sha256": script_sha256})
    return study


def _searched_again(study: optuna.Study, sha256: str) -> None:
    """What a search of the script `sha256` keeps on the study (Session.save_meta)."""
    keep_meta(study, replace(study_meta(study), script_sha256=sha256))


def test_the_best_file_ranks_only_the_probes_of_the_script_it_names():
    """The old script's b=32 ran twice as fast as the new one's b=8: the file is the new script's b=8, with
    the new sha256, and its figures are that probe's."""
    study = _study([_ok(32, 200.0), _ok(8, 100.0)], [OLD, NEW], NEW)
    document = best_document(study, "sqlite:///x.db", stopped="done", partial=False).to_dict()
    assert document["config"]["batch_size"] == 8 and document["measured"]["samples_per_s"] == 100.0
    assert document["script"]["sha256"] == NEW and document["study"]["probes"] == 1
    assert [t.number for t in script_trials(study, OLD)] == [0] and other_script_probes(study) == 1
    stored = StoredStudy(study, "sqlite:///x.db")
    assert stored.best() == Config(batch_size=8) and len(stored.trials_frame()) == 1


def test_probes_recorded_before_trials_carried_their_script_are_the_studys_script_then():
    study = _study([_ok(32, 200.0), _ok(8, 100.0)], [None, None], OLD)
    assert len(script_trials(study)) == 2 and other_script_probes(study) == 0  # never resumed since: as before
    _searched_again(study, NEW)
    assert script_trials(study) == [] and other_script_probes(study) == 2
    _searched_again(study, NEW)  # and again: they stay the first script's
    assert [t.number for t in script_trials(study, OLD)] == [0, 1] and script_trials(study) == []


def test_a_trial_being_asked_counts_as_the_asking_searchers_script_until_it_is_stamped():
    """Optuna writes a trial's params before its searcher can stamp it: another searcher's claim check
    (Session._claimed_earlier) must see that config as claimed, whatever the study's earlier script."""
    study = _study([_ok(8, 100.0)], [None], OLD)
    running = study.ask()
    assert [t.number for t in script_trials(study, NEW)] == [running.number]
    _searched_again(study, NEW)
    study._storage.set_trial_user_attr(running._trial_id, SCRIPT_ATTR, OLD)
    assert script_trials(study) == []
