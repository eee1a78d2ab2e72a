"""The long confirmation run says what the winner does: it may lower the winner's figure (the configs it did
not measure compare at its ratio to their short probes, and one still faster is confirmed in turn), and the
exported file keeps its figure and says so.
Every rate in the file follows the one figure the ranking used (tokens/s, FLOP/s)."""

from __future__ import annotations

import optuna

from autofit.config import Config
from autofit.findings import best_document
from autofit.planner import Observation, Planner, SearchSpace
from autofit.probing import ProbeResult
from autofit.study import open_storage, record_probe

SPACE = SearchSpace.build(batch_range=(8, 64), precision=("fp32",))
GiB = 2**30


def _ok(batch: int, rate: float, phase: str = "explore") -> Observation:
    return Observation(Config(batch_size=batch), "ok", peak_bytes=batch * 2**20, rate=rate, wall_s=1.0, phase=phase,
                       spread=0.02)


def test_a_confirmation_slower_than_the_probes_lowers_the_winner_and_the_next_is_confirmed():
    """b=64 probed twice at 100, confirmed at 85 by its long run; b=32 measured 95 in a short probe. Short
    against short b=64 leads: b=32 compares at 95 x 0.85 (issue 44, item 10: it once took the win on a
    figure of another length), and is confirmed next, since it reads faster than b=64's long run."""
    planner = Planner(SPACE, GiB)
    seen = [_ok(32, 95.0), _ok(64, 100.0), _ok(64, 100.0, "remeasure"), _ok(64, 85.0, "confirm")]
    ranked = planner.ranked(seen)
    assert ranked[0].config == Config(batch_size=64) and ranked[0].rate == 85.0
    assert next(c for c in ranked if c.config == Config(batch_size=32)).rate == 95.0  # its figure stays its own
    assert planner.to_confirm(seen) == Config(batch_size=32)  # the runner-up gets its own long run


def test_three_probes_do_not_outvote_the_confirmation():
    """Three probes count as resolved and disagreeing ones rate at their fastest: a confirmation 15%
    lower used to leave the short figure in the file with confirmed: true."""
    planner = Planner(SPACE, GiB)
    seen = [_ok(64, 100.0), _ok(64, 99.0, "recheck"), _ok(64, 85.0, "confirm")]
    assert planner.ranked(seen)[0].rate == 85.0


def _record(study: optuna.Study, config: Config, rate: float, tokens: float, phase: str) -> None:
    trial = study.ask()
    trial.suggest_int("batch_size", config.batch_size, config.batch_size)
    trial.suggest_categorical("precision", [config.precision])
    trial.suggest_int("checkpoint_segments", 0, 0)
    trial.suggest_int("accumulation_steps", 1, 1)
    result = ProbeResult(status="ok", config=config, samples_per_s=rate, tokens_per_s=tokens,
                         step_time_median_s=0.01, step_time_iqr_s=0.0002, warmup_steps=2, measured_steps=5,
                         wall_s=1.0, peak_bytes=2**20)
    record_probe(study, trial, result, usable_bytes=GiB, phase=phase)


def test_the_file_keeps_the_confirmation_and_derives_tokens_from_the_same_figure(tmp_path):
    storage = f"sqlite:///{tmp_path}/c.db"
    study = optuna.create_study(study_name="c", storage=open_storage(storage), direction="maximize")
    study.set_user_attr("autofit", {
        "script": "train.py", "function": "train", "device": "cpu", "device_info": {"type": "cpu", "name": "cpu"},
        "limit_bytes": 2 * GiB, "limit_given": True, "headroom": 0.5, "usable_bytes": GiB, "space": SPACE.to_dict(),
        "world_size": 1, "allocator": None, "knobs": None, "versions": {}})
    _record(study, Config(batch_size=64), 100.0, 12800.0, "explore")   # 128 tokens a sample
    _record(study, Config(batch_size=64), 120.0, 15360.0, "recheck")   # a faster short probe: its tokens/s was the file's
    _record(study, Config(batch_size=64), 90.0, 11520.0, "confirm")
    _record(study, Config(batch_size=64), 90.0, 11520.0, "confirm")  # 25% below 120: a second round agrees (issue 52)
    measured = best_document(study, storage).to_dict()["measured"]
    assert measured["confirmed"] and measured["rate_from"] == "confirmation"
    assert measured["samples_per_s"] == 90.0
    assert measured["tokens_per_s"] == 90.0 * 128
