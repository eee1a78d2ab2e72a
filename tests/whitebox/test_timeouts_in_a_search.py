"""Whole searches over a fake runner whose probes time out or are cut by the budget where the test says
(tests/support/fake_runner.py): a timeout is a speed fact, never the end of a search, and a round of the A/B
that the budget cuts short is "not measured", never "failed", never drops the leader, and never stops a resumed
search confirming it. White-box: the fake replaces the runner the search builds (autofit.search._pool.make_runner)."""

from __future__ import annotations

import optuna

from autofit.config import Config
from autofit.probing import BUDGET_CUT, ProbeResult
from autofit.search import SearchSettings, run_search
from autofit.study import open_storage, trial_config
from tests.support import script
from tests.support.fake_runner import FakeRunner

SHORT = {16: 50.0, 24: 70.0, 32: 92.0, 48: 85.0, 64: 100.0}


class _Slow(FakeRunner):
    """The fake runner, with chosen probes ending as `outcome(config, steps, n)` says (n: the probe's number)."""

    def __init__(self, *args, outcome, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.outcome = outcome

    def probe(self, config: Config, *, warmup: int = 2, steps: int = 5, **kwargs) -> ProbeResult:
        result = super().probe(config, warmup=warmup, steps=steps, **kwargs)
        error_type = self.outcome(config, steps, len(self.calls) - 1)
        if error_type is None:
            return result
        return ProbeResult(status="timeout", config=config, error_type=error_type, wall_s=self.wall_s,
                           error_message=f"{error_type} (the test's)", memory_limit=self.budget.limit_bytes)


def _search(tmp_path, monkeypatch, outcome, **settings):
    def make_runner(script_path, function=None, **kwargs):
        return _Slow(script_path, function, lambda config, steps: SHORT[config.batch_size], outcome=outcome, **kwargs)

    monkeypatch.setattr("autofit.search._pool.make_runner", make_runner)
    storage = f"sqlite:///{tmp_path}/t.db"
    result = run_search(SearchSettings(script=script("fits_small.py"), storage=storage, study="t", steps=5,
                                       out=str(tmp_path / "best.json"), memory_limit=2**30, batch_range=(16, 64),
                                       precision=("fp32",), estimate=False, confirm_factor=10,
                                       **{"budget_s": 3600.0, **settings}))
    return result, optuna.load_study(study_name="t", storage=open_storage(storage))


def test_the_first_two_probes_timing_out_do_not_end_the_search(tmp_path, monkeypatch):
    """Two timeouts before anything ran once made every strategy unusable: "No config could be measured"."""
    result, study = _search(tmp_path, monkeypatch, lambda config, steps, n: "Timeout" if n < 2 else None)
    statuses = [t.user_attrs["status"] for t in study.trials]
    assert statuses[:2] == ["timeout", "timeout"] and "ok" in statuses
    assert result.best is not None


def test_an_a_b_round_the_budget_cuts_is_not_measured_and_keeps_the_leader(tmp_path, monkeypatch):
    """b=64 leads; b=32 is within its noise; the A/B's rounds are cut by the budget's end: the leader's
    probes stand, nothing "failed its A/B round", and the note says the round was not measured."""
    result, study = _search(tmp_path, monkeypatch,
                            lambda config, steps, n: BUDGET_CUT if steps > 10 else None)
    confirm = [(trial_config(t).batch_size, t.user_attrs["status"]) for t in study.trials
               if t.user_attrs.get("phase") == "confirm"]
    assert confirm and all(status == "timeout" for _, status in confirm)
    assert result.best == Config(batch_size=64)
    assert not any("failed its A/B round" in note for note in result.notes)
    assert any("not measured" in note for note in result.notes)


def test_a_resumed_search_confirms_the_leader_whose_a_b_round_the_budget_cut(tmp_path, monkeypatch):
    """Issue 44, item 7: the cut round was read as the leader's confirmation, so a resumed search never ran its
    A/B and the file said "the A/B measured its entrants below this config's short probes". Resumed with the
    budget to run it, the A/B runs and confirms b=64."""
    _search(tmp_path, monkeypatch, lambda config, steps, n: BUDGET_CUT if steps > 10 else None)
    result, study = _search(tmp_path, monkeypatch, lambda config, steps, n: None)
    measured = [trial_config(t).batch_size for t in study.trials
                if t.user_attrs.get("phase") == "confirm" and t.user_attrs["status"] == "ok"]
    assert 64 in measured
    assert result.best == Config(batch_size=64) and result.document.measured.confirmed


def test_a_replaced_workers_start_is_in_the_budgets_estimate_of_the_next_probe(tmp_path, monkeypatch):
    """A worker replaced after its probe starts afresh before the next one, outside that probe's wall (on an
    H100 two probes of 49.1 s and 51.7 s took 129.8 s of the budget): a next probe whose start alone is past
    the budget left is not launched."""
    monkeypatch.setattr(_Slow, "next_start_s", 10_000.0)  # every probe's worker is replaced, its start longer than the budget
    _, study = _search(tmp_path, monkeypatch, lambda config, steps, n: None, budget_s=600.0)
    explored = [t for t in study.trials if t.user_attrs.get("phase") == "explore"]
    assert len(explored) == 1  # the first probe runs whatever it costs; none after it fits
