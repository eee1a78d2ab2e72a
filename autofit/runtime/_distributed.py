"""Distributed normal runs, launched by torchrun: which rank this is, the config each rank trains
with (the searched global batch kept across ranks), the check that every rank resolved the same
config, and the data sampler and model wrapper a data-parallel train function needs.

Only PyTorch's own pieces: `torch.distributed` (gloo on CPU, NCCL on GPUs), DistributedSampler,
DistributedDataParallel, FSDP2's `fully_shard`. autofit launches nothing itself; torchrun starts the ranks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from autofit.config import Config


@dataclass(frozen=True)
class Ranks:
    """Where this process stands in a distributed run (a single process: rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def ranks_from_env() -> Ranks:
    """This process's ranks: from an initialized process group, else torchrun's environment."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if dist.is_available() and dist.is_initialized():
        return Ranks(dist.get_rank(), dist.get_world_size(), local)
    return Ranks(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")), local)


def per_rank_config(config: Config, world_size: int, searched_world: int = 1) -> tuple[Config, str | None]:
    """The config each rank trains with. The micro-batch is per rank; the searched global batch
    (micro-batch x accumulation x the ranks it was searched on) is kept by sharing the accumulation
    out among this run's ranks when it divides. Otherwise the accumulation stands and the note says
    what the global batch became."""
    if world_size == searched_world:
        return config, None
    total = config.accumulation_steps * searched_world
    if total % world_size == 0:
        return replace(config, accumulation_steps=total // world_size), None
    return config, (f"the global batch is {config.global_batch * world_size} ({config.label()} on each of "
                    f"{world_size} ranks), not the searched {config.global_batch * searched_world}: the "
                    f"accumulation does not divide among them; search with a global batch that does to keep it")


def agree_on_most(value: int) -> int:
    """The largest `value` any rank holds (every rank calls this at the same point of its step);
    `value` itself when no process group is up (ranks that never talk need not agree)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    on_gpu = dist.get_backend() == "nccl"
    tensor = torch.tensor([value], device=torch.device("cuda", torch.cuda.current_device()) if on_gpu else "cpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


_joined = False  # autofit joined the process group (so autofit leaves it)
_leaving_barrier: Any = None  # the work of the last barrier autofit left on, kept until the interpreter exits


def ensure_process_group(device: torch.device) -> None:
    """Join torchrun's process group if the train function has not (gloo on CPU, NCCL on CUDA)."""
    global _joined
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        _joined = True


def leave_process_group() -> None:
    """Leave the process group autofit joined, after a barrier: no rank leaves (and takes the
    rendezvous store with it) while another still needs it."""
    global _joined, _leaving_barrier
    if _joined and dist.is_initialized():
        # The barrier's work is kept until the interpreter exits, so the main thread frees it, not a
        # gloo worker thread. A gloo barrier holds the collectives a worker had not yet let go of: the
        # last gradient all-reduces, whose thread-local state holds a Python object (the context torch
        # keeps during backward). A worker freeing them while the interpreter shuts down dies taking
        # the GIL: "terminate called without an active exception" (SIGABRT) after training finished.
        # destroy_process_group does not stop gloo's workers (DDP keeps the group alive).
        _leaving_barrier = dist.barrier(async_op=True)
        _leaving_barrier.wait()
        dist.destroy_process_group()
    _joined = False


def check_same_config(config: Config) -> None:
    """Every rank must train with the same config: the exported file may differ between machines."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, config.to_dict())
    differing = [rank for rank, other in enumerate(gathered) if other != gathered[0]]
    if differing:
        labels = ", ".join(f"rank {rank}: {Config.from_dict(gathered[rank]).label()}" for rank in [0, *differing])
        raise RuntimeError(f"The ranks of this run must train with one config, but they resolved different ones "
                           f"({labels}): give every machine the same best-config file (AUTOFIT_CONFIG).")


def data_sampler(dataset: Any, ranks: Ranks, *, shuffle: bool, seed: int) -> torch.utils.data.Sampler:
    """Each rank's shard of `dataset`: a DistributedSampler in every case, one process being a world
    of one (the whole dataset, no process group needed), so the same script runs with and without
    torchrun: `set_epoch(epoch)` exists and reshuffles either way."""
    return torch.utils.data.DistributedSampler(dataset, num_replicas=ranks.world_size, rank=ranks.rank,
                                               shuffle=shuffle, seed=seed)


def fully_sharded(model: torch.nn.Module, blocks: list[torch.nn.Module], device: torch.device, *,
                  offload: bool = False) -> torch.nn.Module:
    """`model` sharded with FSDP2: `fully_shard` on each block, then on the root (parameters,
    gradients and optimizer state split across ranks; optionally kept on the CPU between uses)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    model = model.to(device)
    policy = CPUOffloadPolicy() if offload else OffloadPolicy()
    for block in blocks:
        fully_shard(block, offload_policy=policy)
    return fully_shard(model, offload_policy=policy)


def data_parallel(model: torch.nn.Module, device: torch.device) -> torch.nn.parallel.DistributedDataParallel:
    """`model` on this rank's device, wrapped in DistributedDataParallel."""
    model = model.to(device)
    device_ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
