"""Distributed probes: each probe is a torchrun job of N ranks per node, every rank running the
user's function (autofit.probing._rank_process), their results combined into one ProbeResult. On one node the
job is `--standalone`; across nodes (autofit.probing._multinode) each node starts its share of the job and
torchrun's c10d rendezvous joins them.

A config fits only if every rank fits: the peak is the largest rank's, an OOM on any rank is the
config's OOM (that rank exits at once and torchrun stops the others), a rank that dies without a
result makes the probe `crashed`. Throughput is all ranks' samples per second together.

Cost: torchrun keeps no ranks alive between jobs, so every probe starts N fresh processes (Python,
torch and the user's module: a few seconds on a CPU). On one machine a search keeps its ranks instead
(autofit.probing._rank_group, which combines its ranks' results here too); a fresh job per probe is the
path across machines (autofit.probing._multinode), where every node would have to keep a group of its own.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from typing import IO, Any

from autofit.config import Config, widest_envelope
from autofit.errors import UsageError
from autofit.export import MemoryBudget
from autofit.probing._failures import crash_result, log_tail, timeout_result
from autofit.probing._progress import ProbeLimits, ProbeWatch
from autofit.probing._record import ProbeResult, WorkerInfo
from autofit.probing._wire import LoadRequest, ProbeRequest, read_rank_results, write_rank_request
from autofit.probing._worker import Worker

#: Which rank's failure names the probe's status when several failed (an OOM explains the rest).
_PRECEDENCE = ("oom", "diverged", "error", "crashed", "timeout")


class DistributedWorker:
    """Probes as fresh torchrun jobs of `nproc` ranks on this machine (a `ProbeRunner`; `make_runner` gives
    the kept `RankGroup` instead). Across machines, autofit.probing._multinode's `MultiNodeWorker` runs each
    job's share of this node the same way."""

    nnodes = 1
    session: str | None = None
    """The search session a job across machines belongs to (none on one machine)."""
    next_start_s = 0.0
    """Nothing waits for a start before a probe: each probe starts its ranks within its own wall."""

    def __init__(self, script: str, function: str | None = None, *, nproc: int, device: str = "cpu",
                 index: int = 0, budget: MemoryBudget | None = None, log_dir: str | None = None, env: dict[str, str] | None = None) -> None:
        self.script = os.path.abspath(script)
        self.function = function
        self.nproc = nproc
        self.device = device
        self.index = index
        self.budget = budget or MemoryBudget(limit_bytes=None)
        self.log_dir = log_dir
        #: Variables set for the ranks on top of the user's environment (allocator settings).
        self.extra_env = dict(env or {})
        self.info: WorkerInfo | None = None
        self._job: subprocess.Popen | None = None
        self._private_dir: str | None = None
        """Where jobs without a log of their own write, when there is no log_dir: made by mkdtemp
        (mode 0700, a fresh name) for this runner alone, removed by `close`."""

    def __enter__(self) -> DistributedWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return True  # nothing stays running between probes

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    def start(self) -> WorkerInfo:
        """Load the script once, in one process, for what the search needs to know of it."""
        with Worker(self.script, self.function, device=self.device, index=self.index, env=self.extra_env,
                    budget=self.budget, log_dir=self.log_dir) as worker:
            self.info = worker.start()
        return self.info

    def probe(self, config: Config, *, warmup: int = 2, steps: int = 5, timeout: float | ProbeLimits = 300.0,
              log_path: str | None = None, min_measure_s: float | None = None,
              trial_id: int | None = None) -> ProbeResult:
        """One probe of `config` on all ranks, killed by its `timeout` limits (rank 0's progress: see
        `ProbeLimits`); `trial_id` names the job's rendezvous (and, across nodes, the running trial on
        which it is posted for the other nodes)."""
        started = time.perf_counter()
        limits = ProbeLimits.of(timeout)
        request = ProbeRequest(config, warmup=warmup, steps=steps, min_measure_s=min_measure_s,
                               open_step_s=limits.open_step_s(warmup, steps))
        job = self._job_for(request, limits, trial_id)
        results, code, timed_out, log_file = self._run_everywhere(job, log_path, trial_id)
        result = combine(config, results, self.world_size, time.perf_counter() - started, code, timed_out, limits,
                         log_file, self.budget.limit_bytes)
        result.log_path = log_path
        return result

    def _job_for(self, request: ProbeRequest, limits: ProbeLimits, trial_id: int | None) -> dict[str, Any]:
        """The job every node's share runs: the probe, its limits (`timeout`: the longest any node's share
        may run, for the nodes that cannot see rank 0's progress), and its rendezvous."""
        backstop = limits.total_s if limits.total_s is not None else limits.start_s + 10 * limits.stall_s
        return {**request.to_wire(), "label": request.config.label(), "limits": limits.to_wire(),
                "timeout": backstop, "session": self.session,
                "rdzv_id": f"autofit-{self.session or 'local'}-{trial_id if trial_id is not None else 0}"}

    def _run_everywhere(self, job: dict[str, Any], log_path: str | None, trial_id: int | None,
                        ) -> tuple[dict[int, ProbeResult | None], int | None, tuple[str, ProbeWatch] | None, str]:
        """Every rank's result (None: it left none), torchrun's exit status, why the job was killed
        for its limits and what it had done (None: it was not), and where its output went. One
        machine: its ranks are all of them."""
        local, code, timed_out, log_file = self._launch(job, log_path)
        results: dict[int, ProbeResult | None] = dict.fromkeys(range(self.world_size))
        results.update(local)
        return results, code, timed_out, log_file

    def _rendezvous(self, job: dict[str, Any]) -> list[str]:
        """torchrun's flags that say where the job's ranks meet."""
        return ["--standalone"]

    def _launch(self, job: dict, log_path: str | None, stop: Callable[[], bool] | None = None, *,
                lead: bool = True) -> tuple[dict[int, ProbeResult], int | None, tuple[str, ProbeWatch] | None, str]:
        """This node's torchrun share of `job`: its ranks' results (by global rank), torchrun's exit
        status, why it was killed for its limits (and what it had done) or None, and where the ranks'
        output went. `stop`, asked every half second, ends the share early (another node's rank failed).
        The `lead` node's rank 0 writes the progress its limits read; another node's share runs until
        the job's `timeout` at most, node 0 stopping it sooner."""
        load = LoadRequest(self.script, self.function, device=self.device, index=self.index,
                           budget=self.budget)
        with tempfile.TemporaryDirectory(prefix="autofit-ranks-") as out:
            request = os.path.join(out, "request.json")
            progress = os.path.join(out, "progress.json") if lead else None
            probe = ProbeRequest.from_wire({**job, "progress_path": progress})
            write_rank_request(request, load, probe, out)
            command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={self.nproc}",
                       *self._rendezvous(job), "--max-restarts=0", "-m", "autofit.probing._rank_process", request]
            log_file = log_path or self._log_file(f"{job['rdzv_id']}.log")
            env = {**os.environ, **self.extra_env} if self.extra_env else None
            with open_log(log_file) as log:
                self._job = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                             env=env)
                limits = ProbeLimits.from_wire(job["limits"]) if lead and "limits" in job else \
                    ProbeLimits(job["timeout"], job["timeout"], job["timeout"])
                watch = ProbeWatch(limits, progress)
                code, reason = self._wait(watch, stop)
                self._job = None
            results = read_rank_results(out)
        return results, code, (reason, watch) if reason else None, log_file

    def _log_file(self, name: str) -> str:
        """A job's log when the probe names none: in the run's log folder, else in this runner's
        private folder; never a fixed name in the shared temporary folder, where concurrent runs would
        write over each other's and another user could plant a link."""
        if self.log_dir is not None:
            os.makedirs(self.log_dir, exist_ok=True)
            return os.path.join(self.log_dir, name)
        if self._private_dir is None:
            self._private_dir = tempfile.mkdtemp(prefix="autofit-ranks-logs-")
        return os.path.join(self._private_dir, name)

    def _wait(self, watch: ProbeWatch, stop: Callable[[], bool] | None) -> tuple[int | None, str | None]:
        """torchrun's exit status (None when killed), and why it was killed for its limits (None: it
        was not)."""
        while True:
            try:
                return self._job.wait(timeout=watch.wait_s()), None
            except subprocess.TimeoutExpired:
                reason = watch.expired()
                if reason is not None:
                    self.kill()
                    return None, reason
                if stop is not None and stop():
                    self.kill()
                    return None, None

    def kill(self) -> None:
        """Stop a running job at once: torchrun and its ranks (their own session)."""
        job = self._job
        if job is not None and job.poll() is None:
            try:
                os.killpg(job.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            job.wait()

    def close(self) -> None:
        self.kill()
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            self._private_dir = None


def open_log(path: str) -> IO[str]:
    """`path` opened for writing from its start, as a file of this user's (0600), never through a
    symbolic link: a link there is refused, its target left untouched."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(f"A probe's log must be a file, not a symbolic link, but {path} is one.") from None
        raise
    return os.fdopen(fd, "w")


def combine(config: Config, results: dict[int, ProbeResult | None], nproc: int, wall: float, code: int | None,
            timed_out: tuple[str, ProbeWatch] | None, limits: ProbeLimits, log_path: str | None,
            limit: int | None) -> ProbeResult:
    """One result for the job: ok only when every rank ran its steps; else the most telling failure."""
    present = {rank: r for rank, r in results.items() if r is not None}
    peaks = [r.peak_bytes for r in present.values() if r.peak_bytes is not None]
    peak = max(peaks) if peaks else None
    failed = sorted(((rank, r) for rank, r in present.items() if not r.ok),
                    key=lambda item: _PRECEDENCE.index(item[1].status) if item[1].status in _PRECEDENCE else 99)
    if len(present) == nproc and not failed:
        ranks = list(present.values())
        first = ranks[0]
        waiting = max(ranks, key=lambda r: r.data_wait_share or -1.0)  # the rank the data held back most
        return replace(first, knobs=_ranks_knobs(ranks), data_wait_s=waiting.data_wait_s, data_wait_share=waiting.data_wait_share, wall_s=wall, world_size=nproc, peak_bytes=peak, log_path=log_path,
                       samples_per_s=sum(r.samples_per_s or 0 for r in ranks) or None,
                       tokens_per_s=sum(r.tokens_per_s or 0 for r in ranks) or None,
                       step_time_median_s=max((r.step_time_median_s or 0) for r in ranks) or None,
                       step_time_iqr_s=max((r.step_time_iqr_s or 0) for r in ranks),
                       measured_steps=min(r.measured_steps for r in ranks),
                       memory_after_bytes=None, baseline_bytes=max((r.baseline_bytes or 0) for r in ranks) or None,
                       flops_per_s=sum(r.flops_per_s or 0 for r in ranks) or None,
                       mfu=_mean([r.mfu for r in ranks]), joules_per_sample=_mean([r.joules_per_sample for r in ranks]))
    if failed:
        rank, worst = failed[0]
        return replace(worst, wall_s=wall, world_size=nproc, peak_bytes=peak, log_path=log_path,
                       error_message=f"rank {rank} of {nproc}: {worst.error_message or worst.status}",
                       memory_after_bytes=None)
    missing = [rank for rank in range(nproc) if rank not in present]
    if timed_out:
        reason, watch = timed_out
        return timeout_result(config, limits=watch.limits, reason=reason, wall_s=wall, memory_limit=limit,
                              log_path=log_path, ranks=nproc, progress=watch.progress)
    status = f" (torchrun exit status {code})" if code is not None else ""
    return crash_result(config, f"rank(s) {', '.join(map(str, missing))} of {nproc} died without a result{status}; "
                                f"see the probe's log.",
                        error_type="RankCrashed", wall_s=wall, memory_limit=limit, log_path=log_path, ranks=nproc,
                        peak_bytes=peak, traceback=log_tail(log_path))


def _ranks_knobs(ranks: list[ProbeResult]) -> dict | None:
    """Rank 0's knobs, with the token envelope of every rank's micro-batches: a rank that drew a longer
    batch than rank 0 ran it too, so a normal run must not split a batch like it (each rank draws its own
    share of the epoch's batches)."""
    knobs = ranks[0].knobs
    envelopes = [e for r in ranks if (e := (r.knobs or {}).get("token_envelope"))]
    if knobs is None or not envelopes:
        return knobs
    # as TokenEnvelope.widened, on the records' dicts (no torch in this process)
    return {**knobs, "token_envelope": widest_envelope(envelopes)}


def _mean(values: list[float | None]) -> float | None:
    """The ranks' mean of a per-rank figure (MFU, joules per sample), None unless every rank has it."""
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)
