"""What a search is given (SearchSettings) and what it returns (SearchResult): plain records that the
CLI, the decorator's `train.search()` and the benchmarks fill in and read."""

from __future__ import annotations

import os
import sys
from dataclasses import InitVar, dataclass, field

import optuna

from autofit.config import Config
from autofit.devices import default_device, default_device_line, probe_alloc_conf
from autofit.errors import UsageError
from autofit.export import BestConfig
from autofit.options import considered_values
from autofit.planner import Candidate
from autofit.probing import probe_process_for
from autofit.study import open_for_reading

CONFIRM_FACTOR_ENV = "AUTOFIT_CONFIRM_FACTOR"


def default_confirm_factor() -> int:
    """AUTOFIT_CONFIRM_FACTOR where set (a shorter A/B for a tight budget, or for a test suite that checks
    what a search decides rather than how long it measures), else 10."""
    raw = os.environ.get(CONFIRM_FACTOR_ENV, "10")
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"{CONFIRM_FACTOR_ENV} must be a whole number of probes, but got {raw!r}.") from None
    if value < 1:
        raise UsageError(f"{CONFIRM_FACTOR_ENV} must be at least 1, but got {value}.")
    return value


@dataclass(kw_only=True)
class SearchSettings:
    """Everything one search needs; the CLI and `train.search()` both fill this in."""

    script: str
    function: str | None = None
    script_args: tuple[str, ...] = ()
    """The script's own arguments (its sys.argv[1:]) in every probe, the confirmation and the estimator."""
    device: str | None = None
    """cpu or cuda; None: where a normal run trains (autofit.devices.default_device: $AUTOFIT_DEVICE, else
    the first visible GPU, else the CPU), said in one line where that is not the CPU for want of a GPU."""
    index: int | None = None
    """The device's index (None: the default device's, else 0)."""
    memory_limit: int | None = None
    headroom: float = 0.1
    budget_s: float = 1200.0
    trials: int | None = None
    global_batch: int | None = None
    batch_range: tuple[int, int] | None = None
    """Smallest and largest micro-batch to consider (None: the decorator's say)."""
    token_range: tuple[int, int] | None = None
    """Smallest and largest token cap to consider for a function that batches by tokens (None: the decorator's say)."""
    precision: tuple[str, ...] | None = None
    accumulation: tuple[int, ...] | None = None
    consider: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The values to consider of the knobs that take such a list, by knob name (SearchOptions.consider; each
    the command line's `--NAME a,b`), over the decorator's; a knob absent: the decorator's say."""
    study: str | None = None
    storage: str | None = None
    out: str | None = None
    fresh: bool = False
    warmup: int = 2
    steps: int = 5
    probe_timeout: float | None = None
    confirm_factor: int = field(default_factory=default_confirm_factor)
    """The final A/B's windows add up to this many probes' steps (AUTOFIT_CONFIRM_FACTOR, else 10)."""
    seed: int | None = 0
    recheck: bool = True
    """Probe suspect measurements again before they win or prune (off only to measure what it buys)."""
    compile: bool | None = None
    """Probe torch.compile as well as eager when the function offers run.compile() (None: the decorator's say)."""
    alloc_conf: str | None = None
    """PYTORCH_CUDA_ALLOC_CONF for the probes (`--alloc-conf`); None: on CUDA autofit's default
    (`DEFAULT_CUDA_ALLOC_CONF`, expandable segments) unless the environment sets its own, which the probes
    inherit (`probe_alloc_conf`, applied here); either way the best-config file records them."""
    probe_process: str | None = None
    """How each worker runs its probes: "fork" (each in a child of the warm process, the CPU's default) or
    "persistent" (one after another in one process, as on CUDA, where it is the only choice)."""
    estimate: bool = True
    """Ask the memory estimator before probing, so the planner predicts what fits (off: probes alone)."""
    gpus: tuple[int, ...] = ()
    """Probe on all of these GPUs at once, one worker each (`index` is then the first)."""
    parallel: int = 1
    """CPU only: this many probes at once, each in its own worker process under its own memory limit."""
    nproc_per_node: int = 1
    """Each probe a torchrun job of this many ranks (distributed data parallel through run.distribute)."""
    nnodes: int = 1
    """Machines each probe spans (autofit.probing._multinode): the same command runs on every one of them."""
    node_rank: int = 0
    """This machine's place among them: node 0 searches, the others run their share of its probes."""
    rdzv_endpoint: str | None = None
    """HOST:PORT of torchrun's c10d rendezvous for probes across nodes (a port free on HOST)."""

    def __post_init__(self) -> None:
        if self.device is None:
            self.device, index, why = default_device()
            self.index = index if self.index is None else self.index
            line = default_device_line(self.device, self.index, why, given="device=", cpu='device="cpu"')
            if line:
                print(line, file=sys.stderr)
        self.index = self.index or 0
        self.alloc_conf = probe_alloc_conf(self.alloc_conf, self.device)
        if self.confirm_factor < 1:
            raise UsageError(f"The confirmation factor must be at least 1, but got {self.confirm_factor}.")
        self.probe_process = probe_process_for(self.device, self.probe_process)
        if not 0 <= self.headroom < 1:
            raise UsageError(f"The headroom must be a fraction in [0, 1), but got {self.headroom}.")
        if self.parallel < 1:
            raise UsageError(f"The number of parallel probes must be at least 1, but got {self.parallel}.")
        if self.parallel > 1 and self.device != "cpu":
            raise UsageError(f"--parallel is for the CPU, but got --parallel {self.parallel} on {self.device}: "
                             f"list the GPUs instead (--gpu 0,1,2,3), one worker each.")
        if self.nproc_per_node < 1:
            raise UsageError(f"--nproc-per-node must be at least 1, but got {self.nproc_per_node}.")
        if self.nproc_per_node > 1 and (self.parallel > 1 or self.gpus):
            raise UsageError("--nproc-per-node runs each probe on several ranks; it cannot be combined with "
                             "--parallel or a list of GPUs yet.")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise UsageError(f"--node-rank must be in [0, --nnodes), but got --nnodes {self.nnodes} "
                             f"--node-rank {self.node_rank}.")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise UsageError("--nnodes needs --rdzv-endpoint HOST:PORT (node 0's address and a free port), "
                             "the same on every node.")
        if self.nnodes > 1 and (self.parallel > 1 or self.gpus):
            raise UsageError("--nnodes runs each probe across machines; it cannot be combined with --parallel or a "
                             "list of GPUs.")
        self.consider = considered_values(self.consider, self.device, self.world_size)
        if len(set(self.gpus)) != len(self.gpus):
            raise UsageError(f"Each GPU must be listed once, but got --gpu {','.join(map(str, self.gpus))}.")
        if self.trials is not None and self.trials < 1:
            raise UsageError(f"The number of trials must be at least 1, but got {self.trials}.")

    @property
    def world_size(self) -> int:
        """Ranks each probe runs on: all nodes together."""
        return self.nproc_per_node * self.nnodes

    def worker_indices(self) -> tuple[int, ...]:
        """The device index each worker probes on."""
        if self.gpus:
            return tuple(self.gpus)
        return (self.index,) * self.parallel


@dataclass
class SearchResult:
    best: Config | None
    document: BestConfig | None
    """The best-config file's record, as written to `json_path` (None: nothing fits yet)."""
    json_path: str | None
    ranked: list[Candidate]
    study_name: str
    storage: str
    probes: int
    ooms: int
    failed: int
    elapsed_s: float
    stopped: str
    partial: bool = False
    why: str = ""
    usable_bytes: float | None = None
    notes: list[str] = field(default_factory=list)
    url: InitVar[str | None] = None
    """The storage's URL as given, secrets and all: kept in memory only, for `trials_frame` (not a
    field, so neither repr nor asdict shows it); `storage` is the URL as it may be shown."""

    def __post_init__(self, url: str | None) -> None:
        self._url = url

    def trials_frame(self):
        """The study's probes as a pandas DataFrame (see autofit.study._frame.COLUMNS)."""
        from autofit.study import script_trials, trials_frame

        study = optuna.load_study(study_name=self.study_name, storage=open_for_reading(self._url or self.storage))
        return trials_frame(script_trials(study), self.usable_bytes)
