"""The supervisor of the probe process: starts it, times probes out, survives its crashes.

Model memory never enters the searching process: every probe runs in a child that keeps torch and
the user's module loaded. A probe past its timeout is killed (`timeout`); a child that dies is
reported (`crashed`) and replaced on the next probe. A worker that runs its probes in itself (CUDA, and
`--probe-process persistent`) stays from probe to probe: it grows once, in its first probe (CUDA's
kernels loaded at first use, its libraries' handles, compiled modules), and is replaced only for memory
that grows probe after probe, or for tensors a probe left alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import replace
from typing import Any

from autofit.config import Config
from autofit.errors import AutofitError, UsageError, UserCodeError
from autofit.export import MemoryBudget
from autofit.probing._failures import crash_result, describe_exit, log_tail, timeout_result
from autofit.probing._progress import ProbeLimits, ProbeWatch, ProgressFolder
from autofit.probing._record import ProbeResult, WorkerInfo
from autofit.probing._wire import Channel, LoadRequest, ProbeRequest, probe_process_for, result_of, start_child
from autofit.units import format_size

#: The worker runs with the user's own environment: no allocator tuning of ours (a fixed glibc mmap
#: threshold once cost ~30% on allocation-heavy steps and made probes slower than the real run).
#: On CPU each probe runs in a process forked for it, so its memory goes when it exits.
_WORKER_ENV = {"PYTHONUNBUFFERED": "1"}
#: Memory a persistent worker may hold after a probe beyond what it held after its first, before it is
#: replaced (a CPU's heap keeps some of what a probe freed; more is what a probe left behind); on CUDA
#: also the tensors its first probe may leave alive.
LEAK_ALLOWANCE = 64 * 2**20
#: Where the device tells tensors apart (CUDA): memory outside tensors a persistent worker may hold after a probe
#: beyond what it held after its first, before it is replaced: CUDA's kernels and modules loaded for each new
#: shape (a compiled script's Triton modules) grow it a little at every probe, as a fresh worker's would.
OUTSIDE_ALLOWANCE = 256 * 2**20


class WorkerStartError(AutofitError):
    """The worker could not load the script (an error in it, or bad input)."""

    def __init__(self, message: str, traceback: str | None = None) -> None:
        super().__init__(message)
        self.traceback = traceback


class Worker:
    """One persistent probe process for one script, device and memory limit (a `ProbeRunner`)."""

    def __init__(
        self,
        script: str,
        function: str | None = None,
        *,
        device: str = "cpu",
        index: int = 0,
        budget: MemoryBudget | None = None,
        log_dir: str | None = None,
        load_timeout: float = 300.0,
        leak_tolerance: int | None = None,
        env: dict[str, str] | None = None,
        probe_process: str | None = None,
    ) -> None:
        self.script = os.path.abspath(script)
        #: "fork" (each probe in a child of the warm process) or "persistent" (one after another in it).
        self.probe_process = probe_process_for(device, probe_process)
        #: Variables set for the probe process on top of the user's environment (allocator settings).
        self.extra_env = dict(env or {})
        self.function = function
        self.device = device
        self.index = index
        #: The memory its probes run against (a limit of None: the whole device).
        self.budget = budget or MemoryBudget(limit_bytes=None)
        self.log_dir = log_dir
        self.load_timeout = load_timeout
        self.leak_tolerance = leak_tolerance
        self.info: WorkerInfo | None = None
        self.starts = 0
        self.start_s: float | None = None
        """Seconds its last start took (the process, torch, the script, the device's set-up)."""
        self._proc: subprocess.Popen | None = None
        self._channel: Channel | None = None
        self._memory = WarmMemory(leak_tolerance)
        self._progress = ProgressFolder()
        """Where its probes write their progress, removed by `close`."""

    # --- life cycle ---------------------------------------------------------------------------
    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> WorkerInfo:
        """Start the process and load the script; raises UsageError/WorkerStartError on bad input."""
        self.close()
        began = time.perf_counter()
        log = self._log_path("worker.log")
        self._proc, self._channel = start_child(
            "autofit.probing._worker_process", env={**os.environ, **_WORKER_ENV, **self.extra_env},
            new_session=True)  # Ctrl-C in the terminal reaches the supervisor only
        self.starts += 1
        request = LoadRequest(self.script, self.function, device=self.device, index=self.index,
                              budget=self.budget,
                              probe_process=self.probe_process)
        reply = self._channel.request({"op": "load", "request": request.to_wire(), "log_path": log},
                                      self.load_timeout)
        if reply is None:
            code = self._reap()
            self.close()
            raise WorkerStartError(
                f"The worker died while loading {self.script} ({describe_exit(code)}); "
                f"see {log}" if log else f"The worker died while loading {self.script} ({describe_exit(code)})."
            )
        if not reply["ok"]:
            self.close()
            if reply["kind"] == "usage":
                raise UsageError(reply["message"])
            raise WorkerStartError(
                f"The script {os.path.basename(self.script)} failed while loading: {reply['message']}",
                reply.get("traceback"),
            )
        self.info = WorkerInfo(**{k: reply[k] for k in WorkerInfo.__dataclass_fields__})
        self._memory.fresh()
        self.start_s = time.perf_counter() - began
        return self.info

    @property
    def next_start_s(self) -> float:
        """Seconds the next probe waits for a fresh worker before it begins, outside its own wall: a
        replaced or crashed worker's start takes what its last one took; 0.0 while it is warm."""
        return 0.0 if self.alive else (self.start_s or 0.0)

    def close(self) -> None:
        """Stop the process (politely, then by force)."""
        if self._channel is not None:
            try:
                if self.alive:
                    self._channel.send({"op": "exit"})
            except OSError:
                pass
            self._channel.close()
            self._channel = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._kill()
            self._proc = None
        self._progress.remove()

    def kill(self) -> None:
        """Stop at once, the probe running in it lost (an interrupted search)."""
        self._kill()
        self.close()

    # --- probes -------------------------------------------------------------------------------
    def probe(
        self,
        config: Config,
        *,
        warmup: int = 2,
        steps: int = 5,
        timeout: float | ProbeLimits = 300.0,
        log_path: str | None = None,
        min_measure_s: float | None = None,
        trial_id: int | None = None,
    ) -> ProbeResult:
        """Run one probe, killed by its `timeout` limits (`ProbeLimits`; seconds: the start and each
        stretch without progress alike). Every outcome of the user's code is a status; only bad input
        raises. `trial_id` is for runners across nodes; one process has no use for it."""
        began = time.perf_counter()
        if not self.alive:
            self.start()
        assert self._channel is not None
        started = time.perf_counter()
        limits = ProbeLimits.of(timeout)
        request = ProbeRequest(config, warmup=warmup, steps=steps, min_measure_s=min_measure_s,
                               progress_path=self._progress.fresh_path(), open_step_s=limits.open_step_s(warmup, steps))
        watch = ProbeWatch(limits, request.progress_path)
        reply, reason = self._await(request, log_path, watch)
        wall = time.perf_counter() - started
        if reply is None:
            return self._dead_result(config, wall, watch, reason, log_path)
        if not reply["ok"]:
            if reply["kind"] == "usage":
                raise UsageError(reply["message"])
            raise UserCodeError(f"autofit's worker failed: {reply['message']}\n{reply.get('traceback') or ''}")
        result = result_of(reply)
        result.log_path = log_path
        if result.status == "crashed" and result.traceback is None:
            result.traceback = log_tail(log_path)  # faulthandler's stack of the probe's process
        if result.restart_worker:
            self.close()  # a broken CUDA context is never reused: the next probe starts a fresh worker
        elif self._replace_if_leaking(result):
            again = self.probe(config, warmup=warmup, steps=steps, log_path=log_path, min_measure_s=min_measure_s,
                               timeout=_less(ProbeLimits.of(timeout), time.perf_counter() - began))
            again.notes.insert(0, result.notes[-1])  # why it ran again; the first run's own notes were of its figures
            return again
        return result

    def _await(self, request: ProbeRequest, log_path: str | None,
               watch: ProbeWatch) -> tuple[dict[str, Any] | None, str | None]:
        """The probe's reply, or None and why it was given up: a limit of `watch`'s, or None where the
        worker died."""
        try:
            self._channel.send({"op": "probe", "request": request.to_wire(), "log_path": log_path})
        except OSError:
            return None, None
        while True:
            reply = self._channel.receive(watch.wait_s())
            if reply is not None or not self._channel.timed_out:
                return reply, None
            reason = watch.expired()
            if reason is not None:
                return None, reason

    def _dead_result(self, config: Config, wall: float, watch: ProbeWatch, reason: str | None,
                     log_path: str | None) -> ProbeResult:
        if reason is not None:
            self._kill()
        code = self._reap()
        self._kill_group()  # a probe process forked by the worker must not outlive it
        self.close()
        tail = log_tail(log_path)
        if reason is not None:
            return timeout_result(config, limits=watch.limits, reason=reason, wall_s=wall,
                                  memory_limit=self.budget.limit_bytes, log_path=log_path, traceback=tail,
                                  progress=watch.progress)
        return crash_result(config, f"The worker died during the probe ({describe_exit(code)}); "
                                    f"a fresh worker runs the next probe.",
                            wall_s=wall, memory_limit=self.budget.limit_bytes, log_path=log_path, traceback=tail)

    def _replace_if_leaking(self, result: ProbeResult) -> bool:
        """Replace the worker when a probe left memory behind in it (`WarmMemory`), saying why in a note.
        True when `result` itself started on what an earlier probe left (its peak carries it): the caller
        measures it again in the fresh worker."""
        verdict = self._memory.left_behind(result)
        if verdict is None:
            return False
        why, carried = verdict
        self.close()
        result.notes.append(f"{why}; the worker was replaced and the probe ran again in a fresh one (these are its "
                            f"figures)" if carried else
                            f"{why}; the worker was replaced, so the next probe starts where the first did")
        return carried

    # --- plumbing -----------------------------------------------------------------------------
    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)  # its own session: children go too
            except ProcessLookupError:
                pass
            self._proc.wait()

    def _kill_group(self) -> None:
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _reap(self) -> int | None:
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._kill()
            return self._proc.returncode

    def _log_path(self, name: str) -> str | None:
        if self.log_dir is None:
            return None
        os.makedirs(self.log_dir, exist_ok=True)
        return os.path.join(self.log_dir, name)


class WarmMemory:
    """What a worker that runs its probes in itself held after its first probe, and the verdict on each
    probe: the next probe must start where the first did, or its peak (what is compared with the limit)
    carries what earlier probes left.

    A process that runs its probes in itself grows once, in its first probe: CUDA loads kernels at first
    use and creates its libraries' handles, Triton loads its modules (on an H200 a kept worker held 806,
    808, 808 MiB after successive probes, and its probes' peaks matched fresh workers'). So its baseline
    is its memory after its first probe, and a later probe that ends more than the allowance above it
    started on what earlier probes left: memory that grows probe after probe. That probe is measured
    again in a fresh worker. A fresh worker's first probe is then judged by what it grew beyond that one-time
    growth (`one_time`: the first worker's first probe's growth, less the tensors it left where the device
    tells tensors apart), so a fresh worker is not replaced for growing as every fresh worker does; once
    memory grew in a second worker too (`leaks`), the script grows probe after probe, and each of its workers
    goes after a first probe that grows it past the allowance. The allowance is absolute (a share of the limit let 16 GB stand on an 80 GB
    GPU). Where the device tells tensors apart (CUDA: allocated once gc ran, cuBLAS's workspaces went and the
    cache was emptied), tensors still alive and the memory outside them are judged each on its own: tensors
    the first probe left alive are what it left behind; outside them, CUDA's kernels and modules loaded for
    each new shape grow a worker a little at every probe, which a fresh worker would load again, so that
    growth has a larger allowance (`OUTSIDE_ALLOWANCE`: within it, a later probe's peak and cap may carry that
    much of earlier probes' kernels); past it (a library's own allocations held probe after probe) it counts in
    every later probe's peak and lowers its cap, and the worker is replaced. On a CPU (`--probe-process
    persistent`) the heap glibc keeps counts as well."""

    def __init__(self, tolerance: int | None = None) -> None:
        self.tolerance = LEAK_ALLOWANCE if tolerance is None else tolerance
        self.outside_tolerance = max(self.tolerance, OUTSIDE_ALLOWANCE)
        self.leaks = 0
        """Workers of this script whose memory grew past what a probe may leave: after one, a fresh worker is
        judged by its growth beyond `one_time`; after two, each is replaced after a first probe that grows it."""
        self.one_time: int | None = None
        """What a worker's first probe grows it by of itself: the first worker's first probe's growth, less the
        tensors it left where the device tells them apart."""
        self.fresh()

    def fresh(self) -> None:
        """A new worker: nothing measured of it yet."""
        self.baseline: int | None = None
        self.tensors: int | None = None

    def left_behind(self, result: ProbeResult) -> tuple[str, bool] | None:
        """Why the worker must be replaced after `result`, and whether `result` started on what earlier
        probes left; None to keep it."""
        if result.memory_after_bytes is None:
            return None
        tensors = result.allocator.get("tensors_after_bytes")
        if self.baseline is None:
            self.baseline, self.tensors = result.memory_after_bytes, tensors
            why = self._first_left(result, tensors)
            return None if why is None else (why, False)
        growth = result.memory_after_bytes - self.baseline
        grown = _difference(tensors, self.tensors)
        outside = None if grown is None else growth - grown
        if grown is None and growth <= self.tolerance:
            return None
        if grown is not None and grown <= self.tolerance and outside <= self.outside_tolerance:
            return None
        self.leaks += 1
        if grown is None or grown > self.tolerance:
            where = f", {format_size(grown)} of it in tensors still alive" if grown is not None else ""
            return (f"worker memory stayed {format_size(growth)} above what it held after its first probe{where} "
                    f"(memory that grows probe after probe: a leak, or state built at import and changed in "
                    f"place)", True)
        return (f"worker memory outside its tensors stayed {format_size(outside)} above what it held after its first "
                f"probe, more than the {format_size(self.outside_tolerance)} CUDA's kernels for new shapes take "
                f"(memory held outside PyTorch's tensors probe after probe, by a library or the script: it counts in "
                f"every later probe's peak and lowers its cap)", True)

    def _first_left(self, result: ProbeResult, tensors: int | None) -> str | None:
        """What a worker's first probe left that is no growth of the process's own, or None."""
        left = _difference(tensors, result.allocator.get("tensors_at_start_bytes"))
        grown = _difference(result.memory_after_bytes, result.baseline_bytes)
        if self.one_time is None and grown is not None:
            self.one_time = grown - max(0, left or 0)  # the first worker's: what a fresh worker grows by itself
        if left is not None and left > self.tolerance:
            return (f"{format_size(left)} of tensors were still alive after the worker's first probe that were "
                    f"not at its start (what the probe left behind: CUDA's own one-time growth is outside them)")
        if not self.leaks or grown is None:
            return None
        beyond = grown - (self.one_time or 0)
        if self.leaks == 1 and beyond > self.tolerance:
            self.leaks += 1
            return (f"worker memory stayed {format_size(grown)} above where the probe started, {format_size(beyond)} "
                    f"more than a fresh worker's first probe grows it (this script's memory grew in an earlier "
                    f"worker too)")
        if self.leaks >= 2 and grown > self.tolerance:
            return (f"worker memory stayed {format_size(grown)} above where the probe started (this script's "
                    f"memory grew probe after probe in earlier workers)")
        return None


def _difference(after: int | None, before: int | None) -> int | None:
    """One reading less another; None where either is unknown (a CPU cannot tell tensors from its heap)."""
    return None if after is None or before is None else after - before


def _less(limits: ProbeLimits, spent_s: float) -> ProbeLimits:
    """`limits` for a probe run again after `spent_s`: the whole of both within the first's `total_s`."""
    if limits.total_s is None:
        return limits
    return replace(limits, total_s=max(1.0, limits.total_s - spent_s))
