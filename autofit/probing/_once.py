"""One probe of one config, as `autofit probe` runs it: the runner for its ranks and machines, the
precision checked against the device, and across machines node 0 leading and the others following.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autofit.config import Config
from autofit.devices import probe_alloc_conf
from autofit.errors import UsageError
from autofit.export import MemoryBudget
from autofit.probing._multinode import JobBoard, check_nodes, follow, lead_probe, probe_study_name
from autofit.probing._record import ProbeResult
from autofit.probing._runner import ProbeRunner, make_runner
from autofit.probing._wire import probe_process_for

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True, kw_only=True)
class ProbeSettings:
    """Everything one probe needs: what to run, where, on how many ranks and machines, how long."""

    script: str
    config: Config
    function: str | None = None
    device: str = "cpu"
    index: int = 0
    memory_limit: int | None = None
    nproc_per_node: int = 1
    """Ranks per machine: the probe is a torchrun job (data parallel through run.distribute)."""
    nnodes: int = 1
    """Machines the probe spans: the same command runs on every one of them."""
    node_rank: int = 0
    """This machine's place: node 0 leads the probe, the others run their share of it."""
    rdzv_endpoint: str | None = None
    """HOST:PORT of torchrun's c10d rendezvous across machines."""
    warmup: int = 2
    steps: int = 5
    timeout: float = 300.0
    probe_process: str | None = None
    """"fork" or "persistent" (None: the device's default, autofit.probing.probe_process_for)."""

    def __post_init__(self) -> None:
        probe_process_for(self.device, self.probe_process)  # bad input fails here, before any process starts
        if self.nproc_per_node < 1:
            raise UsageError(f"--nproc-per-node must be at least 1, but got {self.nproc_per_node}.")
        check_nodes(self.nnodes, self.node_rank, self.rdzv_endpoint)

    def runner(self, budget: MemoryBudget | None = None) -> ProbeRunner:
        """The runner these settings call for (`budget`: another than the settings' own limit, which a
        node other than 0 reads from the probe's study)."""
        own = MemoryBudget(limit_bytes=self.memory_limit)
        budget = budget if budget is not None and budget.limit_bytes is not None else own
        alloc_conf = probe_alloc_conf(None, self.device)  # a search's default, where the user set none
        return make_runner(self.script, self.function, device=self.device, index=self.index, budget=budget,
                           env={"PYTORCH_CUDA_ALLOC_CONF": alloc_conf} if alloc_conf else None,
                           nproc=self.nproc_per_node, nnodes=self.nnodes, rdzv_endpoint=self.rdzv_endpoint,
                           probe_process=self.probe_process)


def probe_once(settings: ProbeSettings,
               storage: Callable[[], optuna.storages.BaseStorage] | None = None) -> ProbeResult:
    """Run the probe (on node 0, across machines: lead it) and return its result. `storage` opens
    the Optuna storage every machine reaches; it is called only for a probe across machines."""
    if settings.node_rank != 0:
        raise ValueError("a node other than 0 follows the probe (follow_probe)")
    with settings.runner() as runner:
        loaded = runner.start()
        precision = settings.config.precision
        if precision not in loaded.precisions:
            older = settings.device == "cuda" and precision == "bf16"  # a T4, a V100
            raise UsageError(f"The precision must be one the device runs ({', '.join(loaded.precisions)}), "
                             f"but got {precision}" + (": bf16 needs an Ampere or newer GPU (compute capability 8.0); "
                                                       "probe --precision fp16 here." if older else "."))
        if settings.nnodes > 1:
            if storage is None:
                raise ValueError("a probe across machines needs the storage they share")
            return lead_probe(runner, storage(), settings.config, warmup=settings.warmup, steps=settings.steps,
                              timeout=settings.timeout)
        return runner.probe(settings.config, warmup=settings.warmup, steps=settings.steps, timeout=settings.timeout)


def follow_probe(settings: ProbeSettings, storage: optuna.storages.BaseStorage) -> int:
    """A node other than 0: run its share of node 0's probe. Returns the exit status (0: node 0's
    probe ran, whatever its result; 1: node 0 never started one)."""
    board = JobBoard(storage, probe_study_name(settings.rdzv_endpoint))
    return follow(board, settings.runner, node_rank=settings.node_rank, nnodes=settings.nnodes)
