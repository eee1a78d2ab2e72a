"""grows.py that sends SIGINT (a Ctrl-C) to the `autofit search` running it, at the moment named by
AUTOFIT_TEST_INTERRUPT, then keeps that moment going (sleeps) until the search stops it:

    worker-load      while the worker imports this script (the search waits for its workers)
    estimator-load   while the memory estimator imports it (beside the workers' loading or a probe)
    estimate         while the estimator runs the function on fake tensors (first the pilot's, before any probe)
    probe:N          during the Nth probe of this search (1 = the first), counted in
                     AUTOFIT_TEST_INTERRUPT_COUNT (a file)

Unset, it is grows.py: a search resumed without it runs on the same script."""
import os
import signal
import time

from _grow import train_steps

from autofit import autofit

WHEN = os.environ.get("AUTOFIT_TEST_INTERRUPT", "")
# The process this runs in, from its real command line: autofit's children set sys.argv to
# [script], as `python script.py` would. _worker_process.py (and its forked probes), _estimate_process.py.
with open("/proc/self/cmdline", "rb") as _handle:
    _COMMAND = _handle.read().decode(errors="replace")
PROCESS = next((f"{name}.py" for name in ("_worker_process", "_estimate_process") if name in _COMMAND), "")


def _searcher() -> int:
    """The pid of the `autofit.cli search` process above this one (its worker's parent, or ours)."""
    pid = os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            if b"autofit.cli" in handle.read():
                return pid
        with open(f"/proc/{pid}/stat") as handle:
            pid = int(handle.read().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("no autofit search above this process")


def _interrupt() -> None:
    os.kill(_searcher(), signal.SIGINT)
    time.sleep(120)  # this moment lasts: the search must stop it, not wait for it


if (WHEN, PROCESS) in (("worker-load", "_worker_process.py"), ("estimator-load", "_estimate_process.py")):
    _interrupt()


@autofit(batch_range=(1, 512))
def train(run):
    if WHEN == "estimate" and PROCESS == "_estimate_process.py":
        _interrupt()
    if WHEN.startswith("probe:") and PROCESS == "_worker_process.py":
        with open(os.environ["AUTOFIT_TEST_INTERRUPT_COUNT"], "a") as count:
            count.write(".")
            probes = count.tell()
        if probes == int(WHEN.split(":")[1]):
            _interrupt()
    train_steps(run)
