"""Activation offload is a memory knob that rule 1's order does not know (autofit.planner._feasibility): a fit
with it says nothing of the same config without it, which may need more memory."""

from __future__ import annotations

from autofit.config import Config
from autofit.planner._feasibility import implies_fit, implies_too_big


def test_a_fit_with_activation_offload_implies_nothing_of_the_config_without_it():
    offloaded, kept = Config(batch_size=64, offload_activations=True), Config(batch_size=64)
    assert not implies_fit(offloaded, kept)
    assert not implies_too_big(kept, offloaded)
