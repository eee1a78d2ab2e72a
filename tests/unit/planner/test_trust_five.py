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
