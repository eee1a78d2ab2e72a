"""The runners of one search and the threads they live on: one worker per slot (per listed GPU, or
--parallel of them on the CPU), or one torchrun job per probe for a distributed search, across nodes
through a job board. Runners are built in one place, `build_runners`."""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from autofit.config import Config
from autofit.probing import JobBoard, ProbeLimits, ProbeResult, ProbeRunner, WorkerInfo, make_runner
from autofit.search._settings import SearchSettings

if TYPE_CHECKING:
    from autofit.search._session import Session

#: What a search probes with: any runner of the probing contract.
Runner = ProbeRunner


def build_runners(settings: SearchSettings, session: Session, board: JobBoard | None,
                  board_session: str | None) -> list[Runner]:
    """The runners a search probes with (probing.make_runner decides which kind): one per slot, each
    logging to its own folder when there are several; a distributed search has one slot, its ranks
    (across nodes, its jobs posted on `board`)."""
    many = len(session.slots) > 1
    env = {"PYTORCH_CUDA_ALLOC_CONF": settings.alloc_conf} if settings.alloc_conf else None
    return [make_runner(session.script, settings.function, device=settings.device, index=index,
                        budget=session.memory_budget, env=env,
                        log_dir=os.path.join(session.run_dir, f"worker-{n}") if many else session.run_dir,
                        nproc=settings.nproc_per_node, nnodes=settings.nnodes, rdzv_endpoint=settings.rdzv_endpoint,
                        board=board, session=board_session, probe_process=settings.probe_process)
            for n, index in enumerate(session.slots)]


class RunnerPool:
    """The runners, each started and probed from a thread of its own that lives as long as the search:
    a worker process dies with the thread that started it (PR_SET_PDEATHSIG is per thread)."""

    def __init__(self, settings: SearchSettings, session: Session) -> None:
        self.s = settings
        self.board: JobBoard | None = None  # several nodes: where node 0 posts its probes
        self._board_session: str | None = None
        if settings.nnodes > 1:
            self.board = JobBoard(session.storage, session.study_name)
            self._board_session = self.board.open_session(settings.nnodes, settings.nproc_per_node)
        self.runners = build_runners(settings, session, self.board, self._board_session)
        self._names = {id(r): f"cuda:{r.index}" if r.device == "cuda" else f"worker {n}"
                       for n, r in enumerate(self.runners)}
        self._lanes = {id(r): ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"autofit-worker-{n}")
                       for n, r in enumerate(self.runners)}

    def start(self) -> WorkerInfo:
        """Start every runner at once (each loads the script); what the first reported."""
        starts = [self._lanes[id(r)].submit(r.start) for r in self.runners]
        return [start.result() for start in starts][0]

    def name(self, runner: Runner) -> str | None:
        """The runner a probe ran on, as the progress lines name it; None when there is one."""
        return self._names[id(runner)] if len(self.runners) > 1 else None

    def probe(self, runner: Runner, config: Config, *, steps: int, timeout: ProbeLimits, log_path: str,
              trial_id: int, heartbeat: AbstractContextManager) -> Future[ProbeResult]:
        """Probe `config` on `runner`, in the runner's thread, inside the trial's `heartbeat`; across
        nodes, the trial is where the other nodes find the job."""
        across_nodes = {"trial_id": trial_id} if self.s.nnodes > 1 else {}

        def measure() -> ProbeResult:
            with heartbeat:
                return runner.probe(config, warmup=self.s.warmup, steps=steps, timeout=timeout, log_path=log_path,
                                    **across_nodes)

        return self._lanes[id(runner)].submit(measure)

    def stop(self) -> None:
        """Stop every runner's process (an interruption, or a fault): the probes running are lost."""
        for runner in self.runners:
            runner.close()

    def close(self) -> None:
        if self.board is not None:
            self.board.close_session(self._board_session)  # the followers' cue to stop
        for runner in self.runners:
            runner.close()
        for lane in self._lanes.values():
            lane.shutdown(wait=False, cancel_futures=True)
