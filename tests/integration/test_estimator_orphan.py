"""The memory estimator's process never outlives the search that started it: paused (SIGSTOP) between
probes it cannot see its channel close, and a searcher SIGKILLed then used to leave it stopped for good."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support import REPO, script

SEARCHER = """
import os, signal, sys, time
from autofit.memory import Estimator
estimator = Estimator(sys.argv[1])
estimator.wait_ready()
estimator.pause()
print(estimator._process.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_paused_estimator_dies_with_a_searcher_killed_outright():
    searcher = subprocess.Popen([sys.executable, "-c", SEARCHER, script("fits_small.py")], stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONPATH": REPO})
    try:
        pid = int(searcher.stdout.readline())
        # stopped, as between probes: SIGSTOP takes effect when the kernel next schedules it (CI once read "R")
        stopped = time.monotonic() + 10
        while _state(pid) != "T" and time.monotonic() < stopped:
            time.sleep(0.05)
        assert _state(pid) == "T"
    finally:
        searcher.send_signal(signal.SIGKILL)
        searcher.wait()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(pid)
    if alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "the estimator outlived its searcher, stopped"


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z")
