"""The estimator's process loads the script at idle priority (beside the workers' loading), and answers at
normal priority where it runs only in the slices a search gives it: at idle priority a slice went to
whatever else was runnable (a 2-minute CPU search of nanoGPT's loop answered 1 of 6 configs)."""
from __future__ import annotations

import os
import resource

import pytest

from autofit.memory import Estimator
from tests.support import STUDIES


@pytest.mark.slow  # two estimator processes loading torch
@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's scheduling policies")
def test_the_estimator_answers_at_normal_priority_where_it_runs_only_in_the_slices_it_is_given():
    if os.geteuid() != 0 and resource.getrlimit(resource.RLIMIT_NICE)[0] < 20:
        pytest.skip("Linux lets an unprivileged process leave SCHED_IDLE only under RLIMIT_NICE 20 or more")
    with Estimator(f"{STUDIES}/mlp.py", beside_probes=True) as beside, \
            Estimator(f"{STUDIES}/mlp.py", beside_probes=False) as in_slices:
        assert beside.wait_ready() and in_slices.wait_ready()
        assert os.sched_getscheduler(beside._process.pid) == os.SCHED_IDLE
        assert os.sched_getscheduler(in_slices._process.pid) == os.SCHED_OTHER
