"""grows.py that, in each probe, writes down the state of the search's memory estimator process
(the one whose working directory is this probe's): a probe must never run beside it."""
import os

from _grow import train_steps

from autofit import autofit

with open("/proc/self/cmdline", "rb") as _handle:
    IN_WORKER = b"_worker_process" in _handle.read()


def _estimator_states() -> list[str]:
    states = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if b"_estimate_process" not in handle.read() or os.readlink(f"/proc/{pid}/cwd") != os.getcwd():
                    continue
            with open(f"/proc/{pid}/stat") as handle:
                states.append(handle.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            continue
    return states


@autofit(batch_range=(1, 512))
def train(run):
    if IN_WORKER:
        with open(os.environ["ESTIMATOR_STATES"], "a") as out:
            out.write(",".join(_estimator_states()) + "\n")
    train_steps(run)
