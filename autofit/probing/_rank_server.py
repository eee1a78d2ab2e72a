"""One rank of a kept rank group, started once by torchrun for many probes:

    python -m torch.distributed.run --nproc-per-node N --standalone ... -m autofit.probing._rank_server SOCKET

Each rank connects to its runner's Unix socket (autofit.probing._rank_group), says which rank it is, and
then serves the persistent worker's requests (`load`, `probe`: autofit.probing._worker_process), each
rank given the same probe. A probe runs as the worker runs it: forked from the warm rank (the CPU's
default, so all its memory goes when it ends) or in the rank itself (CUDA, `--probe-process persistent`,
the process put back as the script loaded it before each probe).

The process group is the probe's, never the rank's: each probe meets its ranks at a store of its own
(rank 0 hosts it at the port the request names, as `init_process_group`'s env:// reads it), and leaves
it destroyed. A user's function may join the group itself, and a group kept across probes would carry one
probe's pending collectives into the next; a fresh gloo or NCCL group costs milliseconds, the ranks' start
seconds.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from autofit.probing._bootstrap import prepare_process, redirect_output, serve
from autofit.probing._wire import ABORT_SIGNAL, Channel, ProbeRequest
from autofit.probing._worker_process import _Session

_left: list[Any] = []
"""The last barrier the rank left a probe's group on, kept until the next (or the process's exit): the main
thread frees it, never a gloo worker thread (see autofit.runtime's `leave_process_group`)."""


class _RankSession(_Session):
    """The worker's session, in one rank of a group: its probes run with the group's ranks."""

    def __init__(self, ranks: Any) -> None:
        super().__init__()
        self.ranks = ranks
        self.store_port = 0
        signal.signal(ABORT_SIGNAL, self._abort)

    def _abort(self, *_: Any) -> None:
        """Another rank's probe failed: end this rank's, as torchrun ends a fresh job's other ranks (a forked
        probe only; one running in the rank itself cannot be cut short, and its runner replaces the group)."""
        if self.child is not None:
            try:
                os.kill(self.child, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def probe(self, message: dict) -> dict:
        self.store_port = message["store_port"]
        signal.signal(ABORT_SIGNAL, self._abort)  # again: a probe run in the rank may have set its own handler
        return super().probe(message)

    def _run_probe(self, request: ProbeRequest) -> Any:
        # Set in the probe's own process, after the worker put back the environment the script loaded with:
        # the probe (the user's `init_process_group` too) meets the other ranks at this probe's store, not at
        # torchrun's, which outlives it (and holds the keys of earlier probes' groups).
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.store_port),
                           "TORCHELASTIC_USE_AGENT_STORE": "False"})
        result = super()._run_probe(request)
        result.world_size = self.ranks.world_size
        _leave_group(together=result.ok)
        return result


def _leave_group(*, together: bool) -> None:
    """Destroy the probe's process group. After a probe that ended well every rank leaves on a barrier (rank
    0's store must outlive the others' last use); after a failure the others may be gone."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if together:
        _left[:] = [dist.barrier(async_op=True)]
        _left[0].wait()
    dist.destroy_process_group()


def main(argv: list[str]) -> int:
    prepare_process(follow_parent=True)  # torchrun gone (killed for a probe's timeout): this rank goes too
    if os.getppid() == 1:
        return 3
    from autofit.runtime import ranks_from_env

    ranks = ranks_from_env()
    channel = Channel.connect(argv[1])
    channel.send({"rank": ranks.rank, "pid": os.getpid()})
    session = _RankSession(ranks)
    return serve(channel, {"load": session.load, "probe": session.probe},
                 before=lambda message: redirect_output(message.get("log_path")))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
