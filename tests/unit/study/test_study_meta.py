"""The study's stored settings have one owner (issue 38): StudyMeta reads and writes them, old studies included
(the bundled recorded ones, and a study kept before half its settings were), and MemoryBudget is the memory
part a study and a best-config file share."""

from __future__ import annotations

import optuna

from autofit.export import STUDY_ATTR, MemoryBudget
from autofit.study import StudyMeta, bundled_storage_url, keep_meta, stored_meta, study_meta

GiB = 2**30


def _recorded() -> list[optuna.Study]:
    url = bundled_storage_url()
    return [optuna.load_study(study_name=s.study_name, storage=url) for s in optuna.get_all_study_summaries(url)]


def test_every_recorded_study_reads_and_writes_back_what_it_kept():
    studies = _recorded()
    assert len(studies) >= 3
    for study in studies:
        kept = study.user_attrs[STUDY_ATTR]
        meta = study_meta(study)
        assert meta.memory.limit_bytes == kept["limit_bytes"] and meta.memory.usable_bytes == kept["usable_bytes"]
        assert meta.space == kept["space"] and meta.script == kept["script"]
        written = meta.to_dict()
        assert {key: written[key] for key in kept} == kept, study.study_name


def test_a_study_kept_before_its_newer_settings_reads_with_their_defaults():
    old = {"script": "train.py", "function": "train", "device": "cpu", "limit_bytes": 4 * GiB, "headroom": 0.1,
           "usable_bytes": 4 * GiB * 0.9, "space": {"batch_sizes": [1, 2]}}
    meta = StudyMeta.from_dict(old)
    assert (meta.world_size, meta.script_args, meta.limit_given, meta.versions, meta.knobs) == (1, (), True, {}, None)
    assert meta.device_name == "cpu" and meta.memory == MemoryBudget(limit_bytes=4 * GiB, headroom=0.1,
                                                                      usable_bytes=4 * GiB * 0.9)


def test_a_meta_as_a_search_keeps_it_today_round_trips(tmp_path):
    meta = StudyMeta(script="train.py", function="train", device_info={"type": "cpu", "name": "cpu"},
                     memory=MemoryBudget.of(2 * GiB, 0.1), limit_given=False, script_sha256="ab" * 32,
                     script_args=("--lr", "0.1"), space={"batch_sizes": [4, 8]}, world_size=2,
                     allocator={"PYTORCH_CUDA_ALLOC_CONF": None}, knobs={"autocast": True},
                     versions={"torch": "2.13.0"}, probe_process="fork")
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/m.db", study_name="m")
    assert stored_meta(study) is None
    keep_meta(study, meta)
    assert study_meta(optuna.load_study(study_name="m", storage=f"sqlite:///{tmp_path}/m.db")) == meta


def test_a_memory_budget_is_the_limit_less_its_headroom_and_reads_a_probe_studys_partial_form():
    budget = MemoryBudget.of(1000, 0.25)
    assert budget.usable_bytes == 750 and MemoryBudget.from_dict(budget.to_dict()) == budget
    assert MemoryBudget.from_dict({"limit_bytes": None, "usable_bytes": None}) == MemoryBudget(limit_bytes=None)
    assert MemoryBudget.from_dict(None) == MemoryBudget(limit_bytes=None)
