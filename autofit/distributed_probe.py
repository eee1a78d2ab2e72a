"""Distributed probes: each probe is a torchrun job of N ranks on this machine, every rank running
the user's function (autofit._rank_probe), their results combined into one ProbeResult.

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
from dataclasses import replace

from autofit.config import Config
from autofit.record import ProbeResult
from autofit.worker import Worker, WorkerInfo, _tail

#: Which rank's failure names the probe's status when several failed (an OOM explains the rest).
_PRECEDENCE = ("oom", "diverged", "error", "crashed", "timeout")


class DistributedWorker:
    """A worker whose probes run as torchrun jobs of `nproc` ranks; the same interface as Worker."""

    def __init__(self, script: str, function: str | None = None, *, nproc: int, device: str = "cpu",
                 index: int = 0, memory_limit: int | None = None, usable_bytes: int | None = None,
                 log_dir: str | None = None) -> None:
        self.script = os.path.abspath(script)
        self.function = function
        self.nproc = nproc
        self.device = device
        self.index = index
        self.memory_limit = memory_limit
        self.usable_bytes = usable_bytes
        self.log_dir = log_dir
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

    def probe(self, config: Config, *, warmup: int = 2, steps: int = 5, timeout: float = 300.0,
              log_path: str | None = None, min_measure_s: float | None = None) -> ProbeResult:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="autofit-ranks-") as out:
            request = os.path.join(out, "request.json")
            with open(request, "w") as handle:
                json.dump({"script": self.script, "function": self.function, "device": self.device,
                           "config": config.to_dict(), "warmup": warmup, "steps": steps, "out": out,
                           "min_measure_s": min_measure_s,
                           "memory_limit": self.memory_limit, "usable_bytes": self.usable_bytes}, handle)
            command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={self.nproc}",
                       "--standalone", "--max-restarts=0", "-m", "autofit._rank_probe", request]
            log_file = log_path or os.path.join(out, "ranks.log")  # the ranks' output, for a failure's tail
            with open(log_file, "w") as log:
                self._job = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                try:
                    code = self._job.wait(timeout=timeout)
                    timed_out = False
                except subprocess.TimeoutExpired:
                    self.kill()
                    code, timed_out = None, True
                self._job = None
            results = {rank: _read(os.path.join(out, f"rank-{rank}.json")) for rank in range(self.nproc)}
            result = combine(config, results, self.nproc, time.perf_counter() - started, code, timed_out, timeout,
                             log_file, self.memory_limit)
        result.log_path = log_path
        return result

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

