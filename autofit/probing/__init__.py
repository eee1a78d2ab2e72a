"""Probes: one config of the user's function, run for a few real steps in a process of its own, and
measured. The runners that start those processes behind one contract (`ProbeRunner`, picked by
`make_runner`: a persistent worker, a torchrun job, a job across nodes), what every child process
does before it runs the user's code (`bootstrap`, `serve`) and what it says on the wire (`LoadRequest`,
`Channel`, ...), the scripts they load and their version (`ScriptVersion`: the script's code and its local
modules'), and the record a probe leaves (`ProbeResult`).

Kept light: every probe's process imports this package, so nothing here imports torch, optuna or
pandas at import time (the probe itself, `_probe.run_probe`, is imported by the child that runs it)."""

from __future__ import annotations

from autofit.probing._bootstrap import Loaded, ScriptError, bootstrap, die_with_parent, prepare_process, serve
from autofit.probing._failures import BUDGET_CUT, TIMEOUT_TYPES
from autofit.probing._multinode import (
    JobBoard,
    MultiNodeWorker,
    check_nodes,
    follow,
    lead_probe,
    probe_study_name,
)
from autofit.probing._once import ProbeSettings, follow_probe, probe_once
from autofit.probing._progress import ProbeLimits, ProbeWatch, ProgressFile, read_progress
from autofit.probing._rank_group import RankGroup
from autofit.probing._record import STATUSES, ProbeResult, WorkerInfo
from autofit.probing._runner import ProbeRunner, make_runner
from autofit.probing._script import (
    SCRIPT_ARGS_ENV,
    ScriptEntry,
    calls_start,
    check_script,
    decorated_name,
    find_function,
    load_script,
    parse_target,
    pass_script_args,
    script_args_from_env,
)
from autofit.probing._sources import RecordedVersion, ScriptVersion, code_sha256, local_modules, project_root
from autofit.probing._torchrun import DistributedWorker
from autofit.probing._wire import (
    MIN_MEASURE_S,
    PROBE_PROCESSES,
    Channel,
    LoadRequest,
    ProbeRequest,
    failure_reply,
    free_local_port,
    internal_failure,
    ok_reply,
    probe_process_for,
    start_child,
)
from autofit.probing._worker import Worker, WorkerStartError
from autofit.units import INPUT_BOUND_SHARE, input_bound_text

__all__ = [
    "RecordedVersion",
    "ScriptVersion",
    "code_sha256",
    "local_modules",
    "project_root",
    "free_local_port",
    "BUDGET_CUT",
    "MIN_MEASURE_S",
    "TIMEOUT_TYPES",
    "ProbeLimits",
    "ProbeWatch",
    "ProgressFile",
    "read_progress",
    "die_with_parent",
    "INPUT_BOUND_SHARE",
    "PROBE_PROCESSES",
    "STATUSES",
    "Channel",
    "DistributedWorker",
    "RankGroup",
    "JobBoard",
    "LoadRequest",
    "Loaded",
    "MultiNodeWorker",
    "ProbeRequest",
    "ProbeResult",
    "ProbeRunner",
    "ProbeSettings",
    "ScriptError",
    "Worker",
    "WorkerInfo",
    "WorkerStartError",
    "bootstrap",
    "check_nodes",
    "check_script",
    "decorated_name",
    "calls_start",
    "SCRIPT_ARGS_ENV",
    "ScriptEntry",
    "pass_script_args",
    "script_args_from_env",
    "failure_reply",
    "find_function",
    "input_bound_text",
    "follow",
    "follow_probe",
    "internal_failure",
    "lead_probe",
    "load_script",
    "make_runner",
    "ok_reply",
    "parse_target",
    "prepare_process",
    "probe_once",
    "probe_process_for",
    "probe_study_name",
    "serve",
    "start_child",
]
