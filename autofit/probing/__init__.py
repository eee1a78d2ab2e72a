"""Probes: one config of the user's function, run for a few real steps in a process of its own, and
measured. The runners that start those processes (a persistent worker, a torchrun job, a job across
nodes), the scripts they load, and the record a probe leaves (`ProbeResult`).

Kept light: every probe's process imports this package, so nothing here imports torch, optuna or
pandas at import time (the probe itself, `_probe.run_probe`, is imported by the child that runs it)."""

from __future__ import annotations

from autofit.probing._multinode import JobBoard, follow, lead_probe, probe_study_name
from autofit.probing._record import STATUSES, ProbeResult
from autofit.probing._script import check_script, find_function, load_script, parse_target
from autofit.probing._torchrun import DistributedWorker
from autofit.probing._worker import Worker, WorkerInfo, WorkerStartError

__all__ = [
    "STATUSES",
    "DistributedWorker",
    "JobBoard",
    "ProbeResult",
    "Worker",
    "WorkerInfo",
    "WorkerStartError",
    "check_script",
    "find_function",
    "follow",
    "lead_probe",
    "load_script",
    "parse_target",
    "probe_study_name",
]
