"""Distributed probes: each probe is a torchrun job of N ranks per node, every rank running the
user's function (autofit.probing._rank_process), their results combined into one ProbeResult. On one node the
job is `--standalone`; across nodes (autofit.probing._multinode) each node starts its share of the job and
torchrun's c10d rendezvous joins them.

A config fits only if every rank fits: the peak is the largest rank's, an OOM on any rank is the
config's OOM (that rank exits at once and torchrun stops the others), a rank that dies without a
result makes the probe `crashed`. Throughput is all ranks' samples per second together.

Cost: torchrun keeps no ranks alive between jobs, so every probe starts N fresh processes (Python,
torch and the user's module: a few seconds on a CPU); the single-process worker's warm fork is not
available here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace

from autofit.config import Config
from autofit.probing._multinode import RESULTS_GRACE_S, JobBoard
from autofit.probing._record import ProbeResult
from autofit.probing._worker import Worker, WorkerInfo, _tail

#: How long the ranks of a multi-node probe wait for every node to join its rendezvous.
JOIN_TIMEOUT_S = 60
#: Which rank's failure names the probe's status when several failed (an OOM explains the rest).
_PRECEDENCE = ("oom", "diverged", "error", "crashed", "timeout")


class DistributedWorker:
    """A worker whose probes run as torchrun jobs of `nproc` ranks; the same interface as Worker."""

    def __init__(self, script: str, function: str | None = None, *, nproc: int, device: str = "cpu",
                 index: int = 0, memory_limit: int | None = None, usable_bytes: int | None = None,
                 log_dir: str | None = None, nnodes: int = 1, rdzv_endpoint: str | None = None,
                 board: JobBoard | None = None, session: str | None = None) -> None:
        self.script = os.path.abspath(script)
        self.function = function
        self.nproc = nproc
        self.device = device
        self.index = index
        self.memory_limit = memory_limit
        self.usable_bytes = usable_bytes
        self.log_dir = log_dir
        self.nnodes = nnodes
        self.rdzv_endpoint = rdzv_endpoint
        self.board = board
        """Several nodes: where this node (node 0) posts each probe and finds the others' results."""
        self.session = session
        self.info: WorkerInfo | None = None
        self._job: subprocess.Popen | None = None

    def __enter__(self) -> DistributedWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return True  # nothing stays running between probes

    def start(self) -> WorkerInfo:
        """Load the script once, in one process, for what the search needs to know of it."""
        with Worker(self.script, self.function, device=self.device, index=self.index,
                    memory_limit=self.memory_limit, usable_bytes=self.usable_bytes, log_dir=self.log_dir) as worker:
            self.info = worker.start()
        return self.info

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    def probe(self, config: Config, *, warmup: int = 2, steps: int = 5, timeout: float = 300.0,
              log_path: str | None = None, min_measure_s: float | None = None,
              trial_id: int | None = None) -> ProbeResult:
        """One probe of `config` on all ranks; across nodes, `trial_id` is the running trial on which
        the job is posted for the other nodes and their results come back."""
        started = time.perf_counter()
        job = {"config": config.to_dict(), "label": config.label(), "warmup": warmup, "steps": steps,
               "min_measure_s": min_measure_s, "timeout": timeout, "session": self.session,
               "rdzv_id": f"autofit-{self.session or 'local'}-{trial_id if trial_id is not None else 0}"}
        if self.nnodes > 1:
            if self.board is None or trial_id is None:
                raise ValueError("a probe across nodes needs the job board and its trial")
            self.board.post_job(trial_id, job)
        stop = (lambda: self.board.stop_here(trial_id, 0)) if self.nnodes > 1 else None
        local, code, timed_out, log_file = self._launch(job, log_path, stop)
        results: dict[int, ProbeResult | None] = {rank: None for rank in range(self.world_size)}
        results.update(local)
        if self.nnodes > 1:
            self.board.post_results(trial_id, 0, local, code == 0)  # a failure stops the other nodes' ranks
            missing = {rank for rank, r in results.items() if r is None}
            grace = RESULTS_GRACE_S if missing else 0.0
            results.update(self.board.gather(trial_id, range(1, self.nnodes), missing, grace))
        result = combine(config, results, self.world_size, time.perf_counter() - started, code, timed_out, timeout,
                         log_file, self.memory_limit)
        if self.nnodes > 1 and result.status == "crashed":
            result.error_message += (f" Ranks of another node missing: is `autofit search ... --nnodes {self.nnodes} "
                                     f"--node-rank N` running on every other node with the same --study, --storage "
                                     f"and --rdzv-endpoint?")
        result.log_path = log_path
        return result

    def run_job(self, job: dict, stop: Callable[[], bool] | None = None) -> tuple[dict[int, ProbeResult], bool]:
        """A follower node's share of a job node 0 posted: this node's ranks' results, and whether
        its torchrun share ended well."""
        local, code, _, _ = self._launch(job, None, stop)
        return local, code == 0

    def _launch(self, job: dict, log_path: str | None, stop: Callable[[], bool] | None = None,
                ) -> tuple[dict[int, ProbeResult], int | None, bool, str]:
        """This node's torchrun share of `job`: its ranks' results (by global rank), torchrun's exit
        status, whether it was killed for its timeout, and where the ranks' output went. `stop`,
        asked every half second, ends the share early (another node's rank failed)."""
        with tempfile.TemporaryDirectory(prefix="autofit-ranks-") as out:
            request = os.path.join(out, "request.json")
            with open(request, "w") as handle:
                json.dump({"script": self.script, "function": self.function, "device": self.device,
                           "config": job["config"], "warmup": job["warmup"], "steps": job["steps"], "out": out,
                           "min_measure_s": job["min_measure_s"],
                           "memory_limit": self.memory_limit, "usable_bytes": self.usable_bytes}, handle)
            if self.nnodes > 1:
                where = [f"--nnodes={self.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={self.rdzv_endpoint}",
                         f"--rdzv-id={job['rdzv_id']}", f"--rdzv-conf=join_timeout={JOIN_TIMEOUT_S}"]
            else:
                where = ["--standalone"]
            command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={self.nproc}", *where,
                       "--max-restarts=0", "-m", "autofit.probing._rank_process", request]
            log_file = log_path or os.path.join(tempfile.gettempdir(), f"{job['rdzv_id']}.log")
            with open(log_file, "w") as log:
                self._job = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                code, timed_out = self._wait(job["timeout"], stop)
                self._job = None
            results = {}
            for name in os.listdir(out):
                if name.startswith("rank-") and name.endswith(".json"):
                    result = _read(os.path.join(out, name))
                    if result is not None:
                        results[int(name[len("rank-"):-len(".json")])] = result
        return results, code, timed_out, log_file

    def _wait(self, timeout: float, stop: Callable[[], bool] | None) -> tuple[int | None, bool]:
        """torchrun's exit status (None when killed), and whether it ran past `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self._job.wait(timeout=0.5 if stop else max(0.0, deadline - time.monotonic())), False
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    self.kill()
                    return None, True
                if stop is not None and stop():
                    self.kill()
                    return None, False

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


def _read(path: str) -> ProbeResult | None:
    try:
        with open(path) as handle:
            return ProbeResult.from_dict(json.load(handle))
    except (OSError, ValueError):
        return None


def combine(config: Config, results: dict[int, ProbeResult | None], nproc: int, wall: float, code: int | None,
            timed_out: bool, timeout: float, log_path: str | None, limit: int | None) -> ProbeResult:
    """One result for the job: ok only when every rank ran its steps; else the most telling failure."""
    present = {rank: r for rank, r in results.items() if r is not None}
    peaks = [r.peak_bytes for r in present.values() if r.peak_bytes is not None]
    peak = max(peaks) if peaks else None
    failed = sorted(((rank, r) for rank, r in present.items() if not r.ok),
                    key=lambda item: _PRECEDENCE.index(item[1].status) if item[1].status in _PRECEDENCE else 99)
    if len(present) == nproc and not failed:
        ranks = list(present.values())
        first = ranks[0]
        return replace(first, wall_s=wall, world_size=nproc, peak_bytes=peak, log_path=log_path,
                       samples_per_s=sum(r.samples_per_s or 0 for r in ranks) or None,
                       tokens_per_s=sum(r.tokens_per_s or 0 for r in ranks) or None,
                       step_time_median_s=max((r.step_time_median_s or 0) for r in ranks) or None,
                       step_time_iqr_s=max((r.step_time_iqr_s or 0) for r in ranks),
                       measured_steps=min(r.measured_steps for r in ranks),
                       memory_after_bytes=None, baseline_bytes=max((r.baseline_bytes or 0) for r in ranks) or None)
    if failed:
        rank, worst = failed[0]
        return replace(worst, wall_s=wall, world_size=nproc, peak_bytes=peak, log_path=log_path,
                       error_message=f"rank {rank} of {nproc}: {worst.error_message or worst.status}",
                       memory_after_bytes=None)
    missing = [rank for rank in range(nproc) if rank not in present]
    if timed_out:
        return ProbeResult(status="timeout", config=config, wall_s=wall, limit_bytes=limit, world_size=nproc,
                           error_type="Timeout", log_path=log_path,
                           error_message=f"The probe's {nproc} ranks did not finish within {timeout:.0f}s and "
                                         f"were killed; raise --probe-timeout if one step is really that slow.")
    return ProbeResult(status="crashed", config=config, wall_s=wall, limit_bytes=limit, world_size=nproc,
                       peak_bytes=peak, error_type="RankCrashed", log_path=log_path,
                       error_message=f"rank(s) {', '.join(map(str, missing))} of {nproc} died without a result "
                                     f"(torchrun exit status {code}); see the probe's log.",
                       traceback=_tail(log_path))

