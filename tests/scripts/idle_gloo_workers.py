"""Runs another script unchanged (`torchrun idle_gloo_workers.py SCRIPT`), except that once the
process group is up, this process's gloo worker threads (pt_gloo_runloop) run at idle priority
(SCHED_IDLE, Linux): after finishing a collective, a worker then lags behind the main thread, so a
race at the end of a run that shows once in tens of runs on a quiet machine shows in a few."""
import os
import runpy
import sys

import torch.distributed as dist

_init_process_group = dist.init_process_group


def _init_with_idle_workers(*args, **kwargs):
    _init_process_group(*args, **kwargs)
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as handle:
            if handle.read().strip() == "pt_gloo_runloop":
                os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))


dist.init_process_group = _init_with_idle_workers
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
