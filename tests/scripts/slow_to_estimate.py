"""grows.py whose step, in the memory estimator's process only, takes far longer than a search's
budget: a search must go on without waiting for it (and keep what little it answered)."""
import time

from _grow import train_steps

from autofit import autofit

with open("/proc/self/cmdline", "rb") as _handle:
    IN_ESTIMATOR = b"_estimate_process" in _handle.read()


@autofit(batch_range=(1, 512))
def train(run):
    if IN_ESTIMATOR:
        time.sleep(3600)
    train_steps(run)
