"""Trust, round four (issue 44), as a stored study reads: an A/B round the budget cut short is no A/B in the
best-config file's reason (item 7), a stored timeout says whether it stalled or never started (item 8), and the
file names a confirmed config over a short figure of another length (item 10)."""

from __future__ import annotations

import optuna

from autofit.config import Config
from autofit.findings import UNCONFIRMED_BUDGET, best_document, observations
from autofit.planner import SearchSpace
from autofit.probing import BUDGET_CUT, TIMEOUT_TYPES, ProbeResult
from autofit.study import record_probe

SPACE = SearchSpace.build(batch_range=(8, 64), precision=("fp32",))
GiB = 2**30


def _study() -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("autofit", {
        "script": "train.py", "function": "train", "device": "cpu", "device_info": {"type": "cpu", "name": "cpu"},
        "limit_bytes": 2 * GiB, "limit_given": True, "headroom": 0.5, "usable_bytes": GiB, "space": SPACE.to_dict(),
        "world_size": 1, "allocator": None, "knobs": None, "versions": {}})
    return study


def _record(study: optuna.Study, result: ProbeResult, phase: str = "explore") -> None:
    trial = study.ask()
    trial.suggest_int("batch_size", result.config.batch_size, result.config.batch_size)
    trial.suggest_categorical("precision", [result.config.precision])
    trial.suggest_int("checkpoint_segments", 0, 0)
    trial.suggest_int("accumulation_steps", 1, 1)
    record_probe(study, trial, result, usable_bytes=GiB, phase=phase)


def _ok(batch: int, rate: float) -> ProbeResult:
    return ProbeResult(status="ok", config=Config(batch_size=batch), samples_per_s=rate, step_time_median_s=0.01,
                       step_time_iqr_s=0.0002, warmup_steps=2, measured_steps=5, wall_s=1.0, peak_bytes=2**20)


def _timeout(batch: int, error_type: str) -> ProbeResult:
    return ProbeResult(status="timeout", config=Config(batch_size=batch), error_type=error_type, wall_s=30.0,
                       error_message=f"{error_type} (the test's)")


def test_a_winner_whose_only_a_b_round_was_cut_is_unconfirmed_for_the_budget():
    """No A/B measured anything: the file must not say "the A/B measured its entrants below this config's short
    probes" (it did, reading the cut round as measured)."""
    study = _study()
    _record(study, _ok(64, 100.0))
    _record(study, _ok(32, 80.0))
    _record(study, _timeout(64, BUDGET_CUT), phase="confirm")
    measured = best_document(study, "sqlite:///x.db", stopped="budget", partial=False).to_dict()["measured"]
    assert measured["confirmed"] is False and measured["ab"] is None
    assert measured["unconfirmed"] == UNCONFIRMED_BUDGET


def test_a_stored_timeout_says_whether_its_steps_stalled_or_its_start_timed_out():
    """Only a stall says anything of smaller micro-batches (tests/whitebox/test_feasibility_rules.py): the planner
    reads which it was from the stored probe's error type."""
    study = _study()
    _record(study, _timeout(64, TIMEOUT_TYPES["stall"]))
    _record(study, _timeout(32, TIMEOUT_TYPES["start"]))
    _record(study, _timeout(16, BUDGET_CUT))
    read = {o.config.batch_size: o for o in observations(study.trials)}
    assert read[64].stalled and read[64].timed_out
    assert not read[32].stalled and read[32].timed_out
    assert not read[16].stalled and not read[16].timed_out


def test_the_file_names_the_confirmed_config_over_a_short_figure_of_another_length_and_says_why():
    """Item 10, as the bundled recorded searches showed it: b=64's confirmation read 15% under its short probes,
    and b=32, measured once at 95, took the win unconfirmed. Like with like, b=64 keeps it, and the note says at
    what figure b=32 compared (95 x 0.85)."""
    study = _study()
    for result, phase in ((_ok(64, 100.0), "explore"), (_ok(64, 100.0), "remeasure"), (_ok(32, 95.0), "explore"),
                          (_ok(64, 85.0), "confirm")):
        _record(study, result, phase)
    document = best_document(study, "sqlite:///x.db", stopped="budget", partial=False).to_dict()
    assert document["config"]["batch_size"] == 64 and document["measured"]["confirmed"]
    assert document["runner_ups"][0]["samples_per_s"] == 95.0  # its own figure, as measured
    assert "fp32 b=32's 95.0 samples/s counts as 80.8" in document["measured"]["rate_note"]
