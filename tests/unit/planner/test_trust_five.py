"""Trust, round five (issue 52), at the planner: dominance compares every knob a config declares (item 6); an
A/B whose rounds disagree beyond the noise names no winner from one disagreeing round (item 7)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autofit.config import KNOBS, Config
from autofit.planner import ABPlan, Observation, Planner, SearchSpace, dominates

GiB = 2**30
SPACE = SearchSpace.build(batch_range=(8, 64), precision=("fp32", "fp16"))


# --- item 6: dominance compares every knob ------------------------------------------------------------------
#: What dominance orders (more recompute, more accumulation) and the size (compared as the global batch).
_ORDERED = ("checkpoint_segments", "checkpoint_policy", "accumulation_steps")


def _another_value(knob, value):
    """A value of `knob` other than `value` that a config takes (a loader knob with workers to act on)."""
    values = [v for v in knob.trial_values() if v is not None] or [not value]
    return next(v for v in values if v != value)


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.order != "size" and k.name not in _ORDERED],
                         ids=lambda k: k.name)
def test_a_config_that_differs_in_any_other_knob_is_not_the_same_work_and_more(knob):
    """b=24 acc=2 does b=48's work and more; with any other knob changed (activation offload, the memory
    format: the old rule compared five of them by hand) it does other work, and the A/B decides, not the rule.
    Every knob Config declares is checked, so a knob added later is covered by this test too."""
    plain = Config(batch_size=48, precision="bf16", loader_workers=2)
    heavier = Config(batch_size=24, precision="bf16", loader_workers=2, accumulation_steps=2)
    assert dominates(plain, heavier)
    value = _another_value(knob, getattr(plain, knob.name))
    assert not dominates(plain, replace(heavier, **{knob.name: value})), knob.name
    assert not dominates(replace(plain, **{knob.name: value}), heavier), knob.name
    assert dominates(replace(plain, **{knob.name: value}), replace(heavier, **{knob.name: value})), knob.name


def test_offload_and_the_memory_format_are_compared():
    """The two knobs the old rule left out, by name: an offloaded config with more accumulation is not the
    plain one's work and more (offload moves what backward needs to the host: other work)."""
    plain = Config(batch_size=48, precision="bf16")
    assert not dominates(plain, Config(batch_size=24, precision="bf16", accumulation_steps=2, offload_activations=True))
    assert not dominates(plain, Config(batch_size=24, precision="bf16", accumulation_steps=2, channels_last=True))


# --- item 7: an A/B whose rounds disagree beyond the noise decides nothing ----------------------------------
FP32, FP16 = Config(batch_size=64), Config(batch_size=64, precision="fp16")


def _ok(config: Config, rate: float, phase: str = "explore", trial: int | None = None) -> Observation:
    return Observation(config, "ok", peak_bytes=2**26, rate=rate, wall_s=1.0, phase=phase, spread=0.02, trial=trial)


def _busy_host() -> list[Observation]:
    """The reported search: fp32 b=64 read 359k samples/s in its probe, fp16 b=64 340k (within the 10% noise
    b=32's two probes measured); then one short A/B round each on a host loaded 3.5 on 2 cores: 11.2k and 15.2k."""
    return [_ok(Config(batch_size=32), 200_000.0, trial=0), _ok(Config(batch_size=32), 180_000.0, "recheck", 1),
            _ok(FP32, 359_000.0, trial=2), _ok(FP16, 340_000.0, trial=3),
            _ok(FP32, 11_200.0, "confirm", 4), _ok(FP16, 15_200.0, "confirm", 5)]


def test_one_disagreeing_round_each_names_no_winner_and_asks_for_another_round():
    """The old A/B named fp16 b=64 the winner on its 15.2k against 11.2k; each round is 30x off its own probe,
    beyond the noise: the rounds decide nothing, the leader stays the one the probes measured, and the A/B
    runs again."""
    planner = Planner(SPACE, GiB)
    seen = _busy_host()
    assert planner.ranking_margin(seen) == pytest.approx(0.10)
    first = planner.ranked(seen)[0]
    assert first.config == FP32 and first.rate == 359_000.0
    assert first.measurement.rule != "confirmation"
    assert "11,200.0" in first.measurement.undecided and "359,000.0" in first.measurement.undecided
    assert planner.ab_entrants(seen) == [FP32, FP16]
    assert ABPlan((FP32, FP16), rounds=1, steps=20, since=5).next(seen) == FP32  # the next A/B: a round each


def test_rounds_that_disagree_settle_at_three_and_rounds_that_agree_at_two():
    """A second round each that disagrees with the first still decides nothing; a third settles the A/B at the
    rounds' median (they alternated). Two rounds that agree with each other decide at once, even far below the
    probe: a config that slows in long runs is measured, not explained away."""
    planner = Planner(SPACE, GiB)
    seen = _busy_host() + [_ok(FP32, 352_000.0, "confirm", 6), _ok(FP16, 330_000.0, "confirm", 7)]
    assert planner.ranked(seen)[0].measurement.undecided and planner.ab_entrants(seen) == [FP32, FP16]
    seen += [_ok(FP32, 355_000.0, "confirm", 8), _ok(FP16, 335_000.0, "confirm", 9)]
    first = planner.ranked(seen)[0]
    assert (first.config, first.rate, first.measurement.rule) == (FP32, 352_000.0, "confirmation")
    assert first.measurement.undecided is None and planner.ab_entrants(seen) == []
    slows = _busy_host()[:4] + [_ok(FP32, 200_000.0, "confirm", 4), _ok(FP16, 330_000.0, "confirm", 5),
                                _ok(FP32, 205_000.0, "confirm", 6), _ok(FP16, 335_000.0, "confirm", 7)]
    first = planner.ranked(slows)[0]
    assert (first.config, first.measurement.rule, first.measurement.undecided) == (FP16, "confirmation", None)


def test_a_lone_round_within_the_noise_of_its_probe_decides_as_before():
    """A round 5% below its probe (long rounds read a little lower) is within the noise: the A/B decided."""
    planner = Planner(SPACE, GiB)
    seen = _busy_host()[:4] + [_ok(FP32, 341_000.0, "confirm", 4), _ok(FP16, 322_000.0, "confirm", 5)]
    first = planner.ranked(seen)[0]
    assert (first.config, first.measurement.rule, first.measurement.undecided) == (FP32, "confirmation", None)
    assert planner.ab_entrants(seen) == []


def test_a_winner_whose_rounds_stayed_undecided_is_exported_unconfirmed_and_says_why():
    """The search ended after the disagreeing rounds (no budget for another): the file names the probes'
    leader, unconfirmed, and why: its round and its probe, beyond the noise."""
    from autofit.findings import best_document
    from autofit.probing import ProbeResult
    from tests.support.studies import study_of

    seen = _busy_host()
    results = [ProbeResult(status="ok", config=o.config, samples_per_s=o.rate, peak_bytes=2**26,
                           step_time_median_s=0.1, step_time_iqr_s=0.002, measured_steps=5) for o in seen]
    study = study_of(results, SPACE, (8, 64), phases=[o.phase for o in seen])
    document = best_document(study, "memory")
    assert document.config == FP32 and not document.measured.confirmed
    assert "undecided" in document.measured.unconfirmed and "11,200.0" in document.measured.unconfirmed
    assert document.measured.samples_per_s == 359_000.0
