"""Distributed probes on one machine, on a group of ranks kept from probe to probe (a `ProbeRunner`).

A fresh torchrun job per probe (autofit.probing._torchrun) pays Python, torch and the user's module on
every rank before its first step: 10-12 s a probe on a CPU. Here torchrun starts the ranks once
(autofit.probing._rank_server); each rank keeps the script loaded, as the persistent worker does, and
runs every probe as that worker runs it (forked from the warm rank on the CPU, in the rank on CUDA). The
ranks' results are combined as a fresh job's are (`combine`).

The group is replaced, as a worker is, when it cannot be trusted with the next probe: a rank that died
(the whole group goes: torchrun stops the rest), a probe past its limits, a rank whose device is broken
(`restart_worker`), memory that grows probe after probe (`WarmMemory`, per rank), or a rank still busy
`FAILURE_GRACE_S` after another's probe failed (left waiting in a collective). Settings that need other
processes (another environment, rank count or device) are another runner. Across machines each probe is
still a fresh job (autofit.probing._multinode): every node would have to keep its own group, met anew.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import wait
from typing import Any

from autofit.config import Config
from autofit.errors import UsageError, UserCodeError
from autofit.export import MemoryBudget
from autofit.probing._progress import ProbeLimits, ProbeWatch, ProgressFolder
from autofit.probing._record import ProbeResult, WorkerInfo
from autofit.probing._torchrun import DistributedWorker, combine, open_log
from autofit.probing._wire import (
    ABORT_SIGNAL,
    Channel,
    LoadRequest,
    ProbeRequest,
    accept_rank,
    free_local_port,
    listen_for_ranks,
    probe_process_for,
    result_of,
)
from autofit.probing._worker import WarmMemory, WorkerStartError, _less

#: How long the other ranks may take to end their probe once one rank's failed (a peer gone ends a
#: collective at once, a forked probe is ended at once; a probe run in the rank and left waiting at the
#: probe's rendezvous would wait for its timeout, where a fresh job's torchrun stops it at once).
FAILURE_GRACE_S = 3.0


class RankGroup(DistributedWorker):
    """`nproc` ranks on this machine, started once and kept across probes (see the module)."""

    def __init__(self, script: str, function: str | None = None, *, nproc: int, device: str = "cpu",
                 index: int = 0, budget: MemoryBudget | None = None, log_dir: str | None = None,
                 env: dict[str, str] | None = None, probe_process: str | None = None,
                 load_timeout: float = 300.0, leak_tolerance: int | None = None) -> None:
        super().__init__(script, function, nproc=nproc, device=device, index=index, budget=budget,
                         log_dir=log_dir, env=env)
        self.probe_process = probe_process_for(device, probe_process)
        self.load_timeout = load_timeout
        self.starts = 0
        self.start_s: float | None = None
        self.pids: list[int] = []
        """The ranks' processes, by rank (empty while no group runs)."""
        self._channels: list[Channel] = []
        self._memory = [WarmMemory(leak_tolerance) for _ in range(nproc)]
        self._progress = ProgressFolder()
        self._probes = 0
        self._socket_dir: str | None = None
        self._group_log = ""

    @property
    def alive(self) -> bool:
        return bool(self._channels) and self._job is not None and self._job.poll() is None

    @property
    def next_start_s(self) -> float:  # type: ignore[override]
        """As the persistent worker's: a replaced group's start, outside the next probe's wall."""
        return 0.0 if self.alive else (self.start_s or 0.0)

    def start(self) -> WorkerInfo:
        """Start the ranks and load the script in each; rank 0 says what it found."""
        self._stop_group()
        began = time.perf_counter()
        listener = listen_for_ranks(self._socket_path(), self.nproc)
        try:
            self._launch_group(listener.getsockname())
            self._channels = self._join(listener)
        finally:
            listener.close()
        self.starts += 1
        replies = self._ask_all([{"op": "load", "log_path": self._log_path("worker.log"),
                                  "request": self._load(rank).to_wire()} for rank in range(self.nproc)],
                                self.load_timeout)
        try:
            self.info, self.pids = _loaded(replies, self.nproc, self.script)
        except (UsageError, WorkerStartError):
            self._stop_group()
            raise
        for memory in self._memory:
            memory.fresh()
        self.start_s = time.perf_counter() - began
        return self.info

    def probe(self, config: Config, *, warmup: int = 2, steps: int = 5, timeout: float | ProbeLimits = 300.0,
              log_path: str | None = None, min_measure_s: float | None = None,
              trial_id: int | None = None) -> ProbeResult:
        """One probe of `config` on every rank of the group (started first where none runs)."""
        began = time.perf_counter()
        if not self.alive:
            self.start()
        self._probes += 1
        log_file = log_path or self._log_file(f"probe-{trial_id if trial_id is not None else self._probes}.log")
        open_log(log_file).close()  # a file of this user's, never through a link; the ranks append to it
        limits = ProbeLimits.of(timeout)
        request = ProbeRequest(config, warmup=warmup, steps=steps, min_measure_s=min_measure_s,
                               progress_path=self._progress.fresh_path(), open_step_s=limits.open_step_s(warmup, steps))
        watch = ProbeWatch(limits, request.progress_path)
        message = {"op": "probe", "request": request.to_wire(), "log_path": log_file, "store_port": free_local_port()}
        started = time.perf_counter()
        results, aborted, timed_out = self._gather(message, watch)
        result = combine(config, _as_fresh_job(results, aborted), self.world_size, time.perf_counter() - started, None,
                         timed_out, limits, log_file, self.budget.limit_bytes)
        result.log_path = log_path
        if result.status == "crashed" and not result.traceback:  # a SIGKILLed probe leaves no stack in the log
            result.traceback = "\n".join(f"rank {rank}: {r.error_message}" for rank, r in results.items()
                                         if r is not None and r.status == "crashed") or None
        if any(r is not None and r.restart_worker for r in results.values()):
            self._stop_group()  # a broken device context is never reused
        elif result.ok and self._replace_if_leaking(results, result):
            again = self.probe(config, warmup=warmup, steps=steps, log_path=log_path, min_measure_s=min_measure_s,
                               timeout=_less(limits, time.perf_counter() - began), trial_id=trial_id)
            again.notes.insert(0, result.notes[-1])
            return again
        return result

    # --- the group's processes -----------------------------------------------------------------
    def _socket_path(self) -> str:
        """Where the ranks connect: in this runner's private folder, or (a Unix socket's path is at most
        107 bytes) in a private folder of its own under /tmp."""
        if self._socket_dir is None:
            self._socket_dir = tempfile.mkdtemp(prefix="autofit-ranks-")
            if len(self._socket_dir) > 80:
                os.rmdir(self._socket_dir)
                self._socket_dir = tempfile.mkdtemp(prefix="autofit-ranks-", dir="/tmp")
        return os.path.join(self._socket_dir, f"ranks-{self.starts + 1}.sock")

    def _launch_group(self, address: str) -> None:
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={self.nproc}", "--standalone",
                   "--max-restarts=0", "-m", "autofit.probing._rank_server", address]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.extra_env}
        self._group_log = self._log_file(f"group-{self.starts + 1}.log")
        with open_log(self._group_log) as log:
            self._job = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=env)

    def _join(self, listener: Any) -> list[Channel]:
        """Every rank's channel, by rank, as the ranks connect; WorkerStartError when one never does."""
        channels: dict[int, Channel] = {}
        deadline = time.monotonic() + self.load_timeout
        while len(channels) < self.nproc:
            if self._job.poll() is not None or time.monotonic() > deadline:
                for channel in channels.values():
                    channel.close()
                self._stop_group()
                raise WorkerStartError(f"The ranks of {os.path.basename(self.script)} did not start "
                                       f"({self.nproc - len(channels)} of {self.nproc} never connected); "
                                       f"see {self._group_log}.")
            channel = accept_rank(listener, 0.5)
            hello = channel.receive(self.load_timeout) if channel is not None else None
            if hello is not None:
                channels[hello["rank"]] = channel
        return [channels[rank] for rank in range(self.nproc)]

    def _load(self, rank: int) -> LoadRequest:
        return LoadRequest(self.script, self.function, device=self.device, index=rank if self.device == "cuda" else 0,
                           budget=self.budget,
                           probe_process=self.probe_process)

    # --- one request to every rank -------------------------------------------------------------
    def _ask_all(self, messages: list[dict[str, Any]], timeout: float) -> dict[int, dict[str, Any] | None]:
        """Each rank's reply to its message (None: it died or did not answer within `timeout`)."""
        replies = _send_all(self._channels, messages)
        deadline = time.monotonic() + timeout
        while len(replies) < self.nproc and time.monotonic() < deadline:
            _receive_ready(self._channels, replies, deadline - time.monotonic())
        return replies

    def _gather(self, message: dict[str, Any], watch: ProbeWatch,
                ) -> tuple[dict[int, ProbeResult | None], set[int], tuple[str, ProbeWatch] | None]:
        """Every rank's result of the probe, the ranks whose probe was ended for another's failure, and why the
        group was killed for the probe's limits (None: it was not). Once a rank's probe failed the others' are
        ended, as torchrun ends a fresh job's, and leave no result (`_abort`); a rank still busy
        `FAILURE_GRACE_S` later takes the group with it."""
        replies = _send_all(self._channels, [message] * self.nproc)
        aborted: set[int] = set()
        grace_end: float | None = None
        while len(replies) < self.nproc:
            _receive_ready(self._channels, replies, watch.wait_s() if grace_end is None
                           else min(watch.wait_s(), grace_end - time.monotonic()))
            if grace_end is None and any(r is None or not (r["ok"] and result_of(r).ok) for r in replies.values()):
                grace_end = time.monotonic() + FAILURE_GRACE_S
                aborted = self._abort(set(range(self.nproc)) - set(replies))
            reason = watch.expired()
            if reason is not None or (grace_end is not None and time.monotonic() >= grace_end
                                      and len(replies) < self.nproc):
                self._stop_group(at_once=True)
                return _results(replies, aborted, self.nproc), aborted, (reason, watch) if reason else None
        if any(reply is None for reply in replies.values()):
            self._stop_group(at_once=True)  # a rank died: torchrun stops the others, the group is gone
        return _results(replies, aborted, self.nproc), aborted, None

    def _abort(self, ranks: set[int]) -> set[int]:
        """End the probe on `ranks` (their warm processes stay); the ranks told."""
        for rank in ranks:
            try:
                os.kill(self.pids[rank], ABORT_SIGNAL)
            except (ProcessLookupError, IndexError):
                pass
        return ranks

    def _replace_if_leaking(self, results: dict[int, ProbeResult | None], result: ProbeResult) -> bool:
        """As the persistent worker's, with each rank judged on its own memory: replace the group when a probe
        left memory behind in a rank; True when `result` itself started on it (measure it again)."""
        verdicts = [v for rank, r in results.items() if r is not None and (v := self._memory[rank].left_behind(r))]
        if not verdicts:
            return False
        why, carried = max(verdicts, key=lambda verdict: verdict[1])  # a probe to measure again says so first
        self._stop_group()
        result.notes.append(f"{why}; the rank group was replaced and the probe ran again in a fresh one (these are "
                            f"its figures)" if carried else
                            f"{why}; the rank group was replaced, so the next probe starts where the first did")
        return carried

    def _log_path(self, name: str) -> str | None:
        return os.path.join(self.log_dir, name) if self.log_dir is not None else None

    def _stop_group(self, *, at_once: bool = False) -> None:
        """End the group's processes: asked to leave (unless `at_once`), then killed (torchrun and its ranks,
        their own session, none left behind)."""
        for channel in self._channels:
            try:
                if not at_once:
                    channel.send({"op": "exit"})
            except OSError:
                pass
            channel.close()
        self._channels, self.pids = [], []
        if self._job is not None and not at_once:
            try:
                self._job.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        self._job = None

    def kill(self) -> None:
        job = self._job
        if job is not None:
            try:
                os.killpg(job.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            job.wait()

    def close(self) -> None:
        self._stop_group()
        self._progress.remove()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None
        super().close()


def _as_fresh_job(results: dict[int, ProbeResult | None], aborted: set[int]) -> dict[int, ProbeResult | None]:
    """The ranks' results as a fresh job leaves them. There a rank whose process died leaves no result and
    torchrun stops the others at once; here the warm rank reports its probe's process died, and the others
    may still report the error its absence caused them (a peer gone from a collective): no result either.
    A rank whose probe was ended for another's failure (`aborted`) left none, and explains nothing."""
    died = {rank for rank, r in results.items()
            if (r is None and rank not in aborted) or (r is not None and r.status == "crashed")}
    if not died:
        return results
    return {rank: None if rank in died or (r is not None and r.status == "error") else r
            for rank, r in results.items()}


def _send_all(channels: list[Channel], messages: list[dict[str, Any]]) -> dict[int, dict[str, Any] | None]:
    """Each rank its message; the replies so far: None for a rank already gone."""
    gone: dict[int, dict[str, Any] | None] = {}
    for rank, channel in enumerate(channels):
        try:
            channel.send(messages[rank])
        except OSError:
            gone[rank] = None
    return gone


def _receive_ready(channels: list[Channel], replies: dict[int, dict[str, Any] | None], timeout: float) -> None:
    """The replies that came within `timeout`, added to `replies` by rank (a rank gone: None)."""
    waiting = [channel for rank, channel in enumerate(channels) if rank not in replies]
    for channel in wait(waiting, max(0.0, timeout)):
        replies[channels.index(channel)] = channel.receive(0)


def _loaded(replies: dict[int, dict[str, Any] | None], nproc: int, script: str) -> tuple[WorkerInfo, list[int]]:
    """Rank 0's account of the script and the ranks' processes, once every rank loaded it; the failure a
    lone worker raises else."""
    for rank in range(nproc):
        reply = replies.get(rank)
        if reply is None:
            raise WorkerStartError(f"Rank {rank} of {nproc} died while loading {script} (or took longer than "
                                   f"the load timeout); see its log.")
        if not reply["ok"]:
            if reply["kind"] == "usage":
                raise UsageError(reply["message"])
            raise WorkerStartError(f"The script {os.path.basename(script)} failed while loading: {reply['message']}",
                                   reply.get("traceback"))
    return WorkerInfo(**{k: replies[0][k] for k in WorkerInfo.__dataclass_fields__}), \
        [replies[rank]["pid"] for rank in range(nproc)]


def _results(replies: dict[int, dict[str, Any] | None], aborted: set[int], nproc: int,
             ) -> dict[int, ProbeResult | None]:
    """The ranks' results (None: a rank that died, or whose probe was ended for another's failure)."""
    results: dict[int, ProbeResult | None] = dict.fromkeys(range(nproc))
    for rank, reply in replies.items():
        if rank in aborted or reply is None:
            continue
        if not reply["ok"]:
            if reply["kind"] == "usage":
                raise UsageError(reply["message"])
            raise UserCodeError(f"autofit's rank {rank} failed: {reply['message']}\n{reply.get('traceback') or ''}")
        results[rank] = result_of(reply)
    return results
