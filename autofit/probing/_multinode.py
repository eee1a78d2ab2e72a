"""Probes across machines: every node runs `autofit search ... --nnodes M --node-rank R
--rdzv-endpoint HOST:PORT` against one Optuna storage. Node 0 searches; the others follow.

The running trial in the shared storage is the only channel between nodes (no server of ours):
node 0 posts each probe's job on its trial (config, steps, rendezvous id) and starts its torchrun
share; a follower sees the job, starts its own share with the same rendezvous (torchrun's c10d
backend at HOST:PORT makes them one job), and posts its ranks' results back on the trial, where
node 0 combines them with its own. The study's `multinode` attribute says which search session the
followers serve and when it is over.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

# optuna is imported where it is used: this package is loaded by every probe's process too.
if TYPE_CHECKING:
    import optuna

from autofit.config import Config
from autofit.errors import UsageError
from autofit.export import STUDY_ATTR, MemoryBudget
from autofit.probing._progress import ProbeLimits
from autofit.probing._record import ProbeResult
from autofit.probing._torchrun import DistributedWorker

SESSION_ATTR = "multinode"
JOB_ATTR = "multinode_job"
#: How long node 0 waits, after its own ranks ended, for the other nodes' results to arrive.
RESULTS_GRACE_S = 30.0
#: How long the ranks of a multi-node probe wait for every node to join its rendezvous.
JOIN_TIMEOUT_S = 60
_POLL_S = 0.2


_RESULTS_PREFIX = "multinode_ranks_node"


def _results_attr(node_rank: int) -> str:
    return f"{_RESULTS_PREFIX}{node_rank}"


class JobBoard:
    """A study's trials as the meeting point of the nodes of one multi-node search."""

    def __init__(self, storage: optuna.storages.BaseStorage, study_name: str) -> None:
        self.storage = storage
        self.study_name = study_name
        self._study_id: int | None = None

    def study_id(self) -> int | None:
        if self._study_id is None:
            try:
                self._study_id = self.storage.get_study_id_from_name(self.study_name)
            except KeyError:
                return None
        return self._study_id

    # --- node 0 -------------------------------------------------------------------------------
    def open_session(self, nnodes: int, nproc: int) -> str:
        session = uuid.uuid4().hex
        self.storage.set_study_user_attr(self.study_id(), SESSION_ATTR,
                                         {"session": session, "state": "running", "nnodes": nnodes, "nproc": nproc})
        return session

    def close_session(self, session: str) -> None:
        current = self.session()
        if current and current.get("session") == session:
            self.storage.set_study_user_attr(self.study_id(), SESSION_ATTR, {**current, "state": "done"})

    def post_job(self, trial_id: int, job: dict[str, Any]) -> None:
        self.storage.set_trial_user_attr(trial_id, JOB_ATTR, job)

    def gather(self, trial_id: int, nodes: range, wanted: set[int], grace_s: float) -> dict[int, ProbeResult]:
        """The other nodes' rank results on the trial; waits up to `grace_s` for `wanted` ranks."""
        deadline = time.monotonic() + grace_s
        while True:
            attrs = self.storage.get_trial(trial_id).user_attrs
            found = {int(rank): ProbeResult.from_dict(data) for node in nodes
                     for rank, data in (attrs.get(_results_attr(node)) or {}).get("ranks", {}).items()}
            posted = all(_results_attr(node) in attrs for node in nodes)
            if wanted <= set(found) or posted or time.monotonic() > deadline:
                return found
            time.sleep(_POLL_S)

    # --- every node -----------------------------------------------------------------------------
    def stop_here(self, trial_id: int, node_rank: int) -> bool:
        """True when this node's ranks should be stopped: another node's share of the job failed (a
        rank that did not end ok, or died: the others will never reach the next collective), or the
        trial is no longer running. torchrun tears down the ranks of the node where one failed; this
        reaches the other nodes."""
        import optuna

        trial = self.storage.get_trial(trial_id)
        if trial.state != optuna.trial.TrialState.RUNNING:
            return True
        return any(key.startswith(_RESULTS_PREFIX) and key != _results_attr(node_rank) and not posted.get("ok")
                   for key, posted in trial.user_attrs.items())

    def post_results(self, trial_id: int, node_rank: int, results: dict[int, ProbeResult], ok: bool) -> None:
        """This node's ranks' results; `ok`: its torchrun share ended with every rank's steps done."""
        try:
            self.storage.set_trial_user_attr(trial_id, _results_attr(node_rank), {
                "ok": ok, "ranks": {str(rank): r.to_dict() for rank, r in results.items()}})
        except RuntimeError:
            pass  # node 0 already finished the trial (it gave up waiting): nothing to add

    # --- followers ----------------------------------------------------------------------------
    def session(self) -> dict | None:
        study_id = self.study_id()
        if study_id is None:
            return None
        try:
            return self.storage.get_study_user_attrs(study_id).get(SESSION_ATTR)
        except KeyError:  # deleted (node 0's search failed before its first probe): a new one gets a new id
            self._study_id = None
            return None

    def next_job(self, session: str, done: set[int]) -> tuple[int, dict] | None:
        import optuna

        study_id = self.study_id()
        if study_id is None:
            return None
        for trial in self.storage.get_all_trials(study_id, deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            job = trial.user_attrs.get(JOB_ATTR)
            if job and job.get("session") == session and trial._trial_id not in done:
                return trial._trial_id, job
        return None


def check_nodes(nnodes: int, node_rank: int, rdzv_endpoint: str | None) -> None:
    """A UsageError unless this node's place among `nnodes` and the rendezvous make sense."""
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise UsageError(f"--node-rank must be in [0, --nnodes), but got --nnodes {nnodes} --node-rank {node_rank}.")
    if nnodes > 1 and not rdzv_endpoint:
        raise UsageError("--nnodes needs --rdzv-endpoint HOST:PORT (node 0's address and a free port), "
                         "the same on every node.")


class MultiNodeWorker(DistributedWorker):
    """Probes as torchrun jobs across `nnodes` machines (a `ProbeRunner`), joined through torchrun's
    c10d rendezvous at `rdzv_endpoint`. On node 0 (`probe`) each job is posted on its running trial
    through `board` and the other nodes' results gathered from it; on the others (`run_job`, driven
    by `follow`) this node's share of a posted job is run."""

    def __init__(self, script: str, function: str | None = None, *, nproc: int, nnodes: int, rdzv_endpoint: str,
                 device: str = "cpu", index: int = 0, budget: MemoryBudget | None = None,
                 log_dir: str | None = None, env: dict[str, str] | None = None,
                 board: JobBoard | None = None, session: str | None = None) -> None:
        super().__init__(script, function, nproc=nproc, device=device, index=index, budget=budget,
                         log_dir=log_dir, env=env)
        self.nnodes = nnodes
        self.rdzv_endpoint = rdzv_endpoint
        self.board = board
        """Node 0: where it posts each probe and finds the other nodes' results."""
        self.session = session

    def probe(self, config: Config, *, warmup: int = 2, steps: int = 5, timeout: float | ProbeLimits = 300.0,
              log_path: str | None = None, min_measure_s: float | None = None,
              trial_id: int | None = None) -> ProbeResult:
        """One probe of `config` on every node's ranks, posted on the running trial `trial_id`."""
        result = super().probe(config, warmup=warmup, steps=steps, timeout=timeout, log_path=log_path,
                               min_measure_s=min_measure_s, trial_id=trial_id)
        if result.status == "crashed":
            result.error_message += (f" Ranks of another node missing: is `autofit search ... --nnodes {self.nnodes} "
                                     f"--node-rank N` running on every other node with the same --study, --storage "
                                     f"and --rdzv-endpoint?")
        return result

    def _run_everywhere(self, job: dict[str, Any], log_path: str | None, trial_id: int | None,
                        ) -> tuple[dict[int, ProbeResult | None], int | None, tuple | None, str]:
        if self.board is None or trial_id is None:
            raise ValueError("a probe across nodes needs the job board and its trial")
        board = self.board
        board.post_job(trial_id, job)
        local, code, timed_out, log_file = self._launch(job, log_path, lambda: board.stop_here(trial_id, 0))
        results: dict[int, ProbeResult | None] = dict.fromkeys(range(self.world_size))
        results.update(local)
        board.post_results(trial_id, 0, local, code == 0)  # a failure stops the other nodes' ranks
        missing = {rank for rank, r in results.items() if r is None}
        grace = RESULTS_GRACE_S if missing else 0.0
        results.update(board.gather(trial_id, range(1, self.nnodes), missing, grace))
        return results, code, timed_out, log_file

    def _rendezvous(self, job: dict[str, Any]) -> list[str]:
        return [f"--nnodes={self.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={self.rdzv_endpoint}",
                f"--rdzv-id={job['rdzv_id']}", f"--rdzv-conf=join_timeout={JOIN_TIMEOUT_S}"]

    def run_job(self, job: dict, stop: Callable[[], bool] | None = None) -> tuple[dict[int, ProbeResult], bool]:
        """A follower node's share of a job node 0 posted: this node's ranks' results, and whether
        its torchrun share ended well."""
        local, code, _, _ = self._launch(job, None, stop, lead=False)
        return local, code == 0


def follow(board: JobBoard, runner_for: Callable[[MemoryBudget], MultiNodeWorker], *, node_rank: int,
           nnodes: int, wait_s: float = 600.0, out=sys.stderr) -> int:
    """Run this node's share of every probe node 0 posts, until its search ends. `runner_for` gets
    the memory budget node 0 set up for the study. Returns the exit status: 0 when
    the search ended, 1 when no search session appeared within `wait_s`."""
    print(f"autofit: node {node_rank} of {nnodes} waiting for node 0 "
          f"(study {board.study_name})", file=out, flush=True)
    deadline = time.monotonic() + wait_s
    session = None
    while session is None:
        current = board.session()
        if current and current.get("state") == "running":
            session = current["session"]
        elif time.monotonic() > deadline:
            print(f"autofit: no search of study {board.study_name} started within {wait_s:.0f}s; start "
                  f"`autofit search ... --node-rank 0` on the first node with the same --storage and --study.",
                  file=out, flush=True)
            return 1
        else:
            time.sleep(_POLL_S)
    budget = MemoryBudget.from_dict(board.storage.get_study_user_attrs(board.study_id()).get(STUDY_ATTR))
    runner = runner_for(budget)
    done: set[int] = set()
    while True:
        current = board.session() or {}
        if current.get("session") != session or current.get("state") != "running":
            print(f"autofit: node 0 is done; node {node_rank} ran {len(done)} probes",
                  file=out, flush=True)
            return 0
        posted = board.next_job(session, done)
        if posted is None:
            time.sleep(_POLL_S)
            continue
        trial_id, job = posted
        done.add(trial_id)
        results, ok = runner.run_job(job, stop=lambda trial=trial_id: board.stop_here(trial, node_rank))
        board.post_results(trial_id, node_rank, results, ok)
        statuses = sorted({r.status for r in results.values()}) or ["no result"]
        print(f"autofit: node {node_rank}: {job['label']} {', '.join(statuses)}", file=out, flush=True)


def probe_study_name(rdzv_endpoint: str) -> str:
    """The study that carries one `autofit probe` across nodes: the same name on every node."""
    return f"autofit-probe-{rdzv_endpoint}"


def lead_probe(runner: MultiNodeWorker, storage: optuna.storages.BaseStorage, config: Config, *, warmup: int,
               steps: int, timeout: float) -> ProbeResult:
    """Node 0 of `autofit probe --nnodes M`: one probe posted on a trial of its own study, which the
    other nodes (running `follow`) join; the study is left for the next probe on this endpoint."""
    import optuna

    name = probe_study_name(runner.rdzv_endpoint)
    study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True)
    study.set_user_attr(STUDY_ATTR, runner.budget.to_dict())
    board = JobBoard(storage, name)
    runner.board, runner.session = board, board.open_session(runner.nnodes, runner.nproc)
    trial = study.ask()
    try:
        return runner.probe(config, warmup=warmup, steps=steps, timeout=timeout, trial_id=trial._trial_id)
    finally:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)  # a carrier, not a search's trial
        board.close_session(runner.session)
