"""The one contract every probe runner keeps (`ProbeRunner`), and the one place that picks a runner
(`make_runner`): a persistent worker process, a group of torchrun ranks kept on this machine, or a fresh
torchrun job per probe across machines.

A runner owns the processes that run the user's code; the searching process only ever holds its
results. What a runner promises:
- `start()` loads the user's script once and says what it found (`WorkerInfo`): the function, its
  options, the device's precisions, the memory the process needs just to start. Bad input (no such
  function, a limit below that baseline) raises UsageError; a script that fails at import raises
  WorkerStartError with its traceback.
- `probe(config, ...)` runs one probe and returns its `ProbeResult`. Whatever the user's code does
  (runs out of memory, raises, crashes, hangs past its limits, returns too early) is a status in the
  result, never an exception; the runner is ready for the next probe afterwards.
- `kill()` stops a running probe at once (an interrupted search); `close()` (or leaving the `with`
  block) releases every process it started.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from autofit.config import Config
from autofit.export import MemoryBudget
from autofit.probing._multinode import MultiNodeWorker
from autofit.probing._progress import ProbeLimits
from autofit.probing._rank_group import RankGroup
from autofit.probing._record import ProbeResult, WorkerInfo
from autofit.probing._worker import Worker

if TYPE_CHECKING:
    from autofit.probing._multinode import JobBoard


@runtime_checkable
class ProbeRunner(Protocol):
    """Runs probes of one script's function on one device under one memory limit (see the module)."""

    script: str
    function: str | None
    device: str
    index: int
    budget: MemoryBudget
    """The memory its probes run against (a limit of None: the whole device)."""
    info: WorkerInfo | None
    """What `start()` found; None before it."""
    next_start_s: float
    """Seconds the next probe will wait for its process to start, outside its own wall (a replaced
    worker's start: the search's clock counts it); 0.0 where none."""

    def start(self) -> WorkerInfo: ...

    def probe(self, config: Config, *, warmup: int = 2, steps: int = 5, timeout: float | ProbeLimits = 300.0,
              log_path: str | None = None, min_measure_s: float | None = None,
              trial_id: int | None = None) -> ProbeResult:
        """`warmup` steps, then at least `steps` measured ones (more until `min_measure_s` is
        measured); killed by its `timeout` limits (`ProbeLimits`: a start past its limit, steps that
        stop progressing, the search's end; a number of seconds limits the first two alike), its result
        then a `timeout` whose error type says which. `log_path` receives the user's output.
        `trial_id`: the running Optuna trial the probe is recorded on, through which a runner
        across machines reaches the other nodes (the others ignore it)."""
        ...

    def kill(self) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> ProbeRunner: ...

    def __exit__(self, *exc: object) -> None: ...


def make_runner(script: str, function: str | None = None, *, device: str = "cpu", index: int = 0,
                budget: MemoryBudget | None = None, log_dir: str | None = None,
                env: dict[str, str] | None = None, nproc: int = 1, nnodes: int = 1,
                rdzv_endpoint: str | None = None, board: JobBoard | None = None,
                session: str | None = None, probe_process: str | None = None) -> ProbeRunner:
    """The runner for `nproc` ranks on each of `nnodes` machines: one process (the persistent
    `Worker`), a group of torchrun ranks on this machine kept across probes (`RankGroup`), or a fresh
    torchrun job for each probe across
    machines met at `rdzv_endpoint` (`MultiNodeWorker`; node 0 also passes the `board` its jobs are
    posted on and the search `session` they belong to). `env`: variables for the probes' processes
    on top of the user's environment (allocator settings). `probe_process`: how the worker and each kept
    rank run their probes ("fork" or "persistent"; None: the device's default); across machines every
    probe is a fresh job."""
    if nnodes > 1:
        if not rdzv_endpoint:
            raise ValueError("a runner across machines needs the rendezvous endpoint")
        return MultiNodeWorker(script, function, nproc=nproc, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint,
                               device=device, index=index, budget=budget,
                               log_dir=log_dir, env=env, board=board, session=session)
    if nproc > 1:
        return RankGroup(script, function, nproc=nproc, device=device, index=index, budget=budget,
                         log_dir=log_dir, env=env, probe_process=probe_process)
    return Worker(script, function, device=device, index=index, budget=budget,
                  log_dir=log_dir, env=env, probe_process=probe_process)
