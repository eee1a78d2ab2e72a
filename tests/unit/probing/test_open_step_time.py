"""How long a probe follows a loop with a finite loss and no optimizer step (its own long accumulation): what its
limits allow a step, carried to the probe's process on its request (issue 52, items 1-2)."""

from __future__ import annotations

from autofit.config import Config
from autofit.probing import ProbeLimits, ProbeRequest


def test_a_loops_first_step_gets_the_stall_limit_and_leaves_the_budget_room_for_its_steps():
    assert ProbeLimits(300.0, 300.0).open_step_s(2, 5) == 300.0  # `autofit probe --probe-timeout 300`
    assert ProbeLimits(60.0, 60.0, total_s=600.0).open_step_s(2, 5) == 60.0
    assert ProbeLimits(60.0, 60.0, total_s=120.0).open_step_s(2, 5) == 15.0  # 8 such steps fit in what is left


def test_the_time_travels_on_the_probe_request_and_an_older_request_has_none():
    request = ProbeRequest(Config(batch_size=4), open_step_s=15.0)
    assert ProbeRequest.from_wire(request.to_wire()).open_step_s == 15.0
    older = {"config": Config(batch_size=4).to_dict(), "warmup": 2, "steps": 5, "min_measure_s": None}
    assert ProbeRequest.from_wire(older).open_step_s is None
