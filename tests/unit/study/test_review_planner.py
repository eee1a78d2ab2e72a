"""Same process, same answer (issue 23): every figure of the best-config file comes from the probes the
winner's rate comes from, and the winner's long confirmation run may lower it or hand the win on."""
from __future__ import annotations

import optuna
import pytest

from autofit.config import Config
from autofit.export import read_best, write_best
from autofit.findings import best_document, observations
from autofit.planner import SearchSpace
from autofit.probing import ProbeResult
from autofit.study import config_params, distributions

pytestmark = pytest.mark.serial  # tight budgets or speeds measured (pyproject.toml)

GiB = 2**30
SPACE = SearchSpace.build(batch_range=(8, 64), precision=("fp32",))


def _study(probes: list[tuple[int, str, float, float, float | None]]) -> optuna.Study:
    """A stored study of probes (batch, phase, samples/s, tokens per sample, joules per sample), as a
    search writes them."""
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("autofit", {
        "script": "train.py", "function": "train", "device_info": {"type": "cpu", "name": "cpu"},
        "limit_bytes": 8 * GiB, "headroom": 0.1, "usable_bytes": 7 * GiB, "space": SPACE.to_dict()})
    for batch, phase, rate, tokens, joules in probes:
        _add(study, ProbeResult(status="ok", config=Config(batch_size=batch), samples_per_s=rate, tokens_per_s=rate * tokens,
                                joules_per_sample=joules, peak_bytes=batch * 2**20, step_time_median_s=1.0,
                                step_time_iqr_s=0.02, data_wait_share=0.01 if phase == "confirm" else 0.2), phase)
    return study


def _add(study: optuna.Study, result: ProbeResult, phase: str = "explore") -> None:
    dists = distributions((8, 64), 4, 1, offered=("checkpoint_blocks",))
    params = {k: v for k, v in config_params(result.config).items() if k in dists}
    study.add_trial(optuna.trial.create_trial(
        params=params, distributions=dists, value=result.samples_per_s,
        state=optuna.trial.TrialState.COMPLETE if result.ok else optuna.trial.TrialState.FAIL,
        user_attrs={"probe": result.to_dict(), "phase": phase, "status": result.status}))


def _measured(study: optuna.Study) -> dict:
    return best_document(study, "sqlite:///x.db", stopped="done", partial=False).to_dict()["measured"]


def test_every_rate_comes_from_the_probes_the_winner_s_rate_comes_from():
    """Two agreeing probes: samples/s is their median, and so is every per-sample figure behind the
    file's rates (tokens/s was once the fastest probe's while samples/s was the median)."""
    study = _study([(8, "explore", 100.0, 128, 3.0), (16, "explore", 300.0, 128, 2.0),
                    (16, "remeasure", 306.0, 128, 1.0), (16, "recheck", 303.0, 96, 1.2)])
    measured = _measured(study)
    assert measured["samples_per_s"] == 303.0
    assert measured["tokens_per_s"] == pytest.approx(303.0 * 128)  # tokens per sample: median of the three
    assert measured["joules_per_sample"] == pytest.approx(1.2)
    assert measured["data_wait_share"] == pytest.approx(0.2)
    assert measured["rate_from"] == "median"


def test_a_confirmation_below_the_runner_up_moves_the_win_and_the_file_says_why():
    study = _study([(8, "explore", 100.0, 128, None), (32, "explore", 300.0, 128, None),
                    (32, "remeasure", 302.0, 128, None), (16, "explore", 280.0, 128, None),
                    (16, "remeasure", 282.0, 128, None),
                    (32, "confirm", 270.0, 128, None), (16, "confirm", 276.0, 100, None)])
    document = best_document(study, "sqlite:///x.db", stopped="done", partial=False).to_dict()
    measured = document["measured"]
    assert document["config"]["batch_size"] == 16 and measured["confirmed"] is True
    assert measured["samples_per_s"] == 276.0 and measured["rate_from"] == "confirmation"
    assert measured["tokens_per_s"] == pytest.approx(276.0 * 100)  # the confirmation's own tokens per sample
    assert measured["data_wait_share"] == pytest.approx(0.01)
    note = measured["rate_note"]
    assert "confirmation run" in note and "281.0" in note  # the short probes' figure it replaced
    assert "b=32" in note and "270.0" in note  # the config the confirmation put behind it


def test_a_lowered_winner_keeps_the_confirmation_s_figure(tmp_path):
    study = _study([(8, "explore", 100.0, 128, None), (32, "explore", 300.0, 128, None),
                    (32, "remeasure", 302.0, 128, None), (16, "explore", 250.0, 128, None),
                    (32, "confirm", 272.0, 128, None)])
    best = best_document(study, "sqlite:///x.db", stopped="done", partial=False)
    document = best.to_dict()
    measured = document["measured"]
    assert document["config"]["batch_size"] == 32 and measured["samples_per_s"] == 272.0
    assert measured["confirmed"] is True and "10% below" in measured["rate_note"]
    read = read_best(write_best(str(tmp_path / "best.json"), best)).to_dict()["measured"]
    assert read == measured  # the new fields survive the file


@pytest.mark.slow
def test_a_real_confirmation_slower_than_the_probes_hands_the_win_to_the_next(tmp_path):
    from autofit.search import SearchSettings, run_search
    from tests.support import script

    result = run_search(SearchSettings(script=script("slower_when_long.py"), memory_limit=768 * 2**20,
                                       budget_s=300, estimate=False, out=str(tmp_path / "best.json"),
                                       storage=f"sqlite:///{tmp_path}/s.db", study="s",
                                       confirm_factor=10))  # rounds past the 30 steps after which b=16 slows
    measured = read_best(result.json_path).to_dict()["measured"]
    assert result.best == Config(batch_size=12)
    assert measured["confirmed"] is True and measured["rate_from"] == "confirmation"
    assert "b=16 led with" in measured["rate_note"]
    # the A/B of the two within the noise ran b=16 slower over its longer rounds: it says so
    assert any("the A/B changed the winner: fp32 b=12 ranks first now" in note and "above fp32 b=16" in note
               for note in result.notes)


def _selective_space() -> SearchSpace:
    return SearchSpace.build(batch_range=(8, 64), precision=("fp32",), checkpoint_segments=(0, 1, 2, 4),
                             checkpoint_policy=("full", "selective"))


def test_a_selective_policy_that_fails_for_a_reason_not_memory_is_abandoned():
    """As a failing precision is: once another policy runs, one failure of its own rules it out."""
    from autofit.planner import Observation, Planner

    planner = Planner(_selective_space(), 8 * GiB)
    seen = [Observation(Config(batch_size=8), "ok", peak_bytes=2 * GiB, rate=80.0),
            Observation(Config(batch_size=16), "ok", peak_bytes=4 * GiB, rate=160.0),
            Observation(Config(batch_size=32), "oom"),  # checkpointing is what reaches larger batches
            Observation(Config(batch_size=32, checkpoint_segments=1, checkpoint_policy="selective"), "error")]
    proposals = []
    while (config := planner.next(seen)) is not None and len(proposals) < 40:
        proposals.append(config)
        if config.checkpoint_policy == "selective":  # it fails again, whatever the blocks or batch
            seen.append(Observation(config, "error"))
        else:
            seen.append(Observation(config, "ok", peak_bytes=config.batch_size * GiB // 8, rate=5.0 * config.batch_size))
    assert any(c.checkpoint_segments for c in proposals)  # checkpointing was explored
    assert not [c for c in proposals if c.checkpoint_policy == "selective"]


def test_the_search_says_why_selective_checkpointing_was_abandoned():
    from autofit.findings import fault_notes
    from autofit.planner import Planner

    study = _study([(8, "explore", 80.0, 1, None)])
    _add(study, ProbeResult(status="error", config=Config(batch_size=8, checkpoint_segments=1, checkpoint_policy="selective"),
                            error_type="RuntimeError", error_message="no saved tensor for op"))
    planner = Planner(_selective_space(), 8 * GiB)
    notes = fault_notes(study, planner, observations(study.get_trials()))
    assert notes == ["selective checkpointing is unusable here: RuntimeError: no saved tensor for op (trial 1)"]


def test_the_planner_probes_one_micro_batch_a_step_after_an_oom_while_accumulating():
    """A large model with small activations: its gradients (4 GiB) outweigh half the batch's activations,
    so (64, acc=1) may fit where (32, acc=2) did not. Neither the OOM nor the accumulating probes' memory
    line (whose intercept holds the gradients) may rule it out unprobed."""
    from autofit.planner import Observation, Planner

    space = SearchSpace.build(batch_range=(4, 64), precision=("fp32",), global_batch=64)
    seen = [Observation(Config(batch_size=8, accumulation_steps=8), "ok", peak_bytes=int(5.4 * GiB), rate=80.0),
            Observation(Config(batch_size=16, accumulation_steps=4), "ok", peak_bytes=int(5.8 * GiB), rate=150.0),
            Observation(Config(batch_size=32, accumulation_steps=2), "oom")]
    assert Planner(space, 6.5 * GiB).next(seen) == Config(batch_size=64)
