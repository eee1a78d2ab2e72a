"""What the runners and their child processes say to each other: one encoding, two transports.

The encoding, for every child (the probe worker, the ranks of a torchrun job, the memory estimator):
a `LoadRequest` (load the user's function, on which device, under which limit), a `ProbeRequest`
(one config, its steps), and replies that are plain data: `{"ok": True, ...}`, with a probe's
`ProbeResult` as `result_reply` writes it, or a failure `{"ok": False, "kind": "usage" | "script" |
"internal", "message": ..., "traceback": ...}`. Everything on the wire is JSON-able, so the same
dicts go through a socket, a file or a study's attributes (a job posted across nodes).

The transports differ where they must:
- a `Channel` (a socket pair, messages pickled by multiprocessing's Connection) for the children
  autofit starts itself and keeps for many requests: the worker and the estimator. The user's prints
  never reach it (they go to fd 1 and 2, a log file); a child that dies is end-of-file and one that
  hangs is a poll that times out, so the supervisor never blocks on a broken child.
- files for the ranks of a fresh torchrun job: torchrun starts them, so no socket can be handed down,
  and each rank writes its own result file (atomically), so a rank killed mid-job leaves the others'
  results readable.
- a `Channel` again for the ranks of a kept rank group (autofit.probing._rank_group): each rank
  connects to a Unix socket in its runner's private folder (`listen_for_ranks`, `Channel.connect`).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import traceback
from dataclasses import dataclass, fields
from multiprocessing.connection import Connection
from typing import IO, Any

from autofit.config import Config
from autofit.errors import UsageError
from autofit.export import MemoryBudget
from autofit.probing._record import ProbeResult

#: How a worker runs its probes: each in a child forked from the warm process ("fork", the CPU's
#: default), or one after another in the process itself ("persistent", as CUDA must).
PROBE_PROCESSES = ("fork", "persistent")


def probe_process_for(device: str, asked: str | None) -> str:
    """The process model a worker on `device` runs its probes in: `asked`, else the device's default.
    A CUDA context cannot be forked, so CUDA is always persistent."""
    if asked is not None and asked not in PROBE_PROCESSES:
        raise UsageError(f"The probe process must be one of {', '.join(PROBE_PROCESSES)}, but got {asked!r}.")
    if device == "cuda":
        if asked == "fork":
            raise UsageError("The probe process must be persistent on CUDA (a CUDA context cannot be forked), "
                             "but got --probe-process fork.")
        return "persistent"
    return asked or "fork"


@dataclass(frozen=True)
class LoadRequest:
    """Load the user's function in a child process: which script and function, on which device,
    under which memory budget (None: the whole device), and how its probes run (`probe_process`, one of
    PROBE_PROCESSES). On the wire the budget is its two numbers, `memory_limit` and `usable_bytes`."""

    script: str
    function: str | None = None
    device: str = "cpu"
    index: int = 0
    budget: MemoryBudget | None = None
    probe_process: str = "fork"

    def to_wire(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "budget"}
        usable = self.budget.usable_bytes if self.budget else None
        return {**data, "memory_limit": self.budget.limit_bytes if self.budget else None,
                "usable_bytes": None if usable is None else int(usable)}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> LoadRequest:
        kwargs = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        budget = MemoryBudget(limit_bytes=data.get("memory_limit"), usable_bytes=data.get("usable_bytes"))
        return cls(**kwargs, budget=budget if budget.limit_bytes is not None else None)


#: A probe measures at least this long (unless its steps reach 50x the asked number): five 3 ms steps are
#: too short to time.
MIN_MEASURE_S = 0.5


@dataclass(frozen=True)
class ProbeRequest:
    """Probe one config: `warmup` steps, then `steps` measured ones (more, up to `min_measure_s`)."""

    config: Config
    warmup: int = 2
    steps: int = 5
    min_measure_s: float | None = None
    progress_path: str | None = None
    """Where the probe writes its progress for its runner (autofit.probing._progress); None: nowhere."""
    open_step_s: float | None = None
    """How long the probe follows a loop with a finite loss and no optimizer step past the micro-batches it
    allows (`ProbeLimits.open_step_s`); None: it ends there."""

    def to_wire(self) -> dict[str, Any]:
        """The keys a job posted across nodes has always carried (studies keep them), where the probe's
        progress goes, and how long it follows a loop to its first step."""
        return {"config": self.config.to_dict(), "warmup": self.warmup, "steps": self.steps,
                "min_measure_s": self.min_measure_s,
                **({"progress_path": self.progress_path} if self.progress_path else {}),
                **({"open_step_s": self.open_step_s} if self.open_step_s is not None else {})}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ProbeRequest:
        return cls(Config.from_dict(data["config"]), warmup=data.get("warmup", 2), steps=data.get("steps", 5),
                   min_measure_s=data.get("min_measure_s"), progress_path=data.get("progress_path"),
                   open_step_s=data.get("open_step_s"))


# --- replies ----------------------------------------------------------------------------------------
def ok_reply(**fields: Any) -> dict[str, Any]:
    return {"ok": True, **fields}


def result_reply(result: ProbeResult) -> dict[str, Any]:
    """A probe's result, as every child sends it."""
    return ok_reply(result=result.to_dict())


def result_of(reply: dict[str, Any]) -> ProbeResult:
    return ProbeResult.from_dict(reply["result"])


def failure_reply(kind: str, message: str, traceback: str | None = None) -> dict[str, Any]:
    """A request the child could not serve. `kind`: "usage" (bad input: `message` is for the user as
    it is), "script" (the user's module failed to import), "internal" (anything else)."""
    return {"ok": False, "kind": kind, "message": message, "traceback": traceback}


def internal_failure(exc: BaseException) -> dict[str, Any]:
    """An unexpected exception as a failure reply; call it where the exception is being handled."""
    return failure_reply("internal", f"{type(exc).__name__}: {exc}", traceback.format_exc())


# --- files: the ranks of a torchrun job --------------------------------------------------------------
def write_rank_request(path: str, load: LoadRequest, probe: ProbeRequest, out: str) -> None:
    with open(path, "w") as handle:
        json.dump({"load": load.to_wire(), "probe": probe.to_wire(), "out": out}, handle)


def read_rank_request(path: str) -> tuple[LoadRequest, ProbeRequest, str]:
    with open(path) as handle:
        data = json.load(handle)
    return LoadRequest.from_wire(data["load"]), ProbeRequest.from_wire(data["probe"]), data["out"]


def rank_result_path(out: str, rank: int) -> str:
    return os.path.join(out, f"rank-{rank}.json")


def write_rank_result(out: str, rank: int, result: ProbeResult) -> None:
    """Atomically: a reader sees the whole result or none."""
    path = rank_result_path(out, rank)
    with open(path + ".tmp", "w") as handle:
        json.dump(result.to_dict(), handle)
    os.replace(path + ".tmp", path)


def read_rank_results(out: str) -> dict[int, ProbeResult]:
    """The results the ranks wrote to `out`, by global rank (a rank that died wrote none)."""
    results = {}
    for name in os.listdir(out):
        if name.startswith("rank-") and name.endswith(".json"):
            try:
                with open(os.path.join(out, name)) as handle:
                    results[int(name[len("rank-"):-len(".json")])] = ProbeResult.from_dict(json.load(handle))
            except (OSError, ValueError):
                continue
    return results


# --- the channel: a socket to a child autofit keeps ----------------------------------------------------
class Channel:
    """One end of a connection between a supervisor and its child; messages are wire dicts."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.timed_out = False
        """Whether the last `receive` gave up at its timeout (rather than finding the child gone)."""

    @classmethod
    def from_fd(cls, fd: int) -> Channel:
        """The child's end, from the descriptor its command line names."""
        return cls(Connection(fd))

    @classmethod
    def pipe(cls) -> tuple[Channel, Channel]:
        """A one-way channel (reading end, writing end), for a process forked for one probe."""
        read_end, write_end = os.pipe()
        return cls(Connection(read_end, writable=False)), cls(Connection(write_end, readable=False))

    @classmethod
    def connect(cls, path: str) -> Channel:
        """A rank's end: connected to the Unix socket its runner listens on (`listen_for_ranks`)."""
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(path)
        return cls(Connection(client.detach()))

    def fileno(self) -> int:
        """For `multiprocessing.connection.wait` over several channels."""
        return self._connection.fileno()

    def send(self, message: dict[str, Any]) -> None:
        self._connection.send(message)

    def receive(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next message; None when the other end is gone or nothing came within `timeout`."""
        self.timed_out = False
        try:
            if timeout is not None and not self._connection.poll(timeout):
                self.timed_out = True
                return None
            return self._connection.recv()
        except (EOFError, OSError):
            return None

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """Send `message` and wait for the reply (None: the child died, or ran past `timeout`)."""
        self.timed_out = False
        try:
            self.send(message)
        except OSError:
            return None
        return self.receive(timeout)

    def close(self) -> None:
        self._connection.close()


#: What a kept rank's runner sends the rank to end its running probe (another rank's failed).
ABORT_SIGNAL = signal.SIGUSR1


def listen_for_ranks(path: str, backlog: int) -> socket.socket:
    """A Unix socket at `path` (in a folder private to the runner) that a group's ranks connect to."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(backlog)
    return listener


def accept_rank(listener: socket.socket, timeout: float) -> Channel | None:
    """The next rank's channel, or None when none connected within `timeout` seconds."""
    listener.settimeout(timeout)
    try:
        connection, _ = listener.accept()
    except (TimeoutError, socket.timeout):
        return None
    connection.settimeout(None)
    return Channel(Connection(connection.detach()))


def free_local_port() -> int:
    """A local TCP port nothing listens on, for a server started later (one probe's store, which rank 0 of a
    kept group hosts; a test's rendezvous or PostgreSQL). Drawn below the kernel's ephemeral range: a port from
    bind(0) is in that range, where by the time the server binds it an outgoing connection may hold it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            low = int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free local port below the ephemeral range ({low})")


def start_child(module: str, *, output: int | IO[Any] = subprocess.DEVNULL, env: dict[str, str] | None = None,
                new_session: bool = False) -> tuple[subprocess.Popen, Channel]:
    """`python -m MODULE FD`, FD its end of a socket pair; the process and the supervisor's channel.
    `output`: where the child's fd 1 and 2 go (the user's prints); `new_session`: its own process
    group, which Ctrl-C in the terminal does not reach and which can be killed as a whole."""
    parent, child = socket.socketpair()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", module, str(child.fileno())],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=output,
            stderr=subprocess.DEVNULL if output is subprocess.DEVNULL else subprocess.STDOUT,
            env=env, start_new_session=new_session,
        )
    except BaseException:
        parent.close()
        raise
    finally:
        child.close()
    return process, Channel(Connection(parent.detach()))
