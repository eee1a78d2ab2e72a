"""The space a search probes: the decorator's options with the command line's on top, the precisions
the device runs, and the knobs the training function offers. A search starts before it knows those
knobs; its first probe reports them, and the space narrows to what the function can change."""

from __future__ import annotations

import os

from autofit.config import CONSIDERED, KNOBS, LOADER_PREFETCH
from autofit.errors import UsageError
from autofit.options import SearchOptions
from autofit.planner import LoaderChoices, SearchSpace, loader_worker_counts, shared_cores_loader_note, token_caps
from autofit.probing import WorkerInfo
from autofit.search._settings import SearchSettings


def search_options(info: WorkerInfo, settings: SearchSettings) -> SearchOptions:
    """The decorator's options (as the worker read them from the script), overridden by the settings."""
    options = SearchOptions(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in info.options.items()}) \
        if info.options else SearchOptions()
    return options.merged(global_batch=settings.global_batch, batch_range=settings.batch_range,
                          precision=settings.precision, accumulation=settings.accumulation,
                          consider=settings.consider, compile=settings.compile, token_range=settings.token_range)


def build_space(settings: SearchSettings, options: SearchOptions, info: WorkerInfo, knobs: dict | None) -> SearchSpace:
    """The configs worth probing; `knobs` (None until the first probe reports them) drops the settings
    the function ignores: precision without run.autocast(), accumulation without run.backward(), ..."""
    precisions = info.precisions
    wanted = options.precision or tuple(info.default_precisions)
    unsupported = [p for p in wanted if p not in precisions]
    if unsupported:
        raise UsageError(f"The precision must be one the device runs ({', '.join(precisions)}), "
                         f"but got {', '.join(unsupported)}.")
    if knobs is not None and knobs.get("forces_tf32") and "tf32" in wanted and "fp32" in wanted:
        # The function turns TF32 on itself: its fp32 runs TF32 math, the same as tf32; one of them, named
        # for what runs.
        wanted = tuple(p for p in wanted if p != "fp32")
    if knobs is not None and not knobs.get("autocast"):
        # The function never enters run.autocast(): precision changes nothing, it computes in fp32
        # (as the memory estimator assumes then).
        wanted = ("fp32",) if "fp32" in wanted else wanted[:1]
    blocks = knobs.get("checkpoint_blocks") if knobs else None
    accumulations = options.accumulation
    if knobs is not None and not knobs.get("backward") and accumulations:
        accumulations = (1,)
    global_batch = options.global_batch
    world = settings.world_size
    if global_batch and world > 1:  # the micro-batch and accumulation are per rank
        if global_batch % world:
            raise UsageError(f"The global batch must divide among the {world} ranks, but got {global_batch}.")
        global_batch //= world
    # A knob for several ranks only where a probe spans them and the function offers its blocks to shard.
    considered = {k.name: options.considered(k.name, settings.device) for k in CONSIDERED
                  if not k.ranks or (world > 1 and knobs is not None and knobs.get("shard_blocks"))}
    compiles = (False, True) if knobs and knobs.get("compile") and options.compile else (False,)
    own = (knobs or {}).get("own_batch")  # a loop that reads no batch knob: its micro-batch is not searched
    return SearchSpace.build(batch_range=(own, own) if own else options.batch_range,
                             token_range=token_range(options, knobs),
                             precisions=tuple(wanted), first_precision=first_precision(info, wanted),
                             checkpoint_blocks=blocks, use_checkpoint=options.checkpoint,
                             global_batch=global_batch, accumulations=accumulations, considered=considered,
                             compiles=compiles, loader=loader_choices(settings, knobs),
                             global_tokens=options.global_tokens,
                             longest_sample=(knobs or {}).get("longest_sample"),
                             variants=tuple(k.name for k in KNOBS
                                            if k.order == "compute" and (knobs or {}).get(k.offer)))


def first_precision(info: WorkerInfo, wanted: tuple[str, ...]) -> str | None:
    """The precision the pilot runs: the first of the device's defaults that the search may try (bf16 on
    a GPU that runs it natively, fp32 on a CPU)."""
    return next((p for p in info.default_precisions if p in wanted), None)


def token_range(options: SearchOptions, knobs: dict | None) -> tuple[int, int] | None:
    """For a function that batches by tokens (run.token_batches), the token caps to climb
    (autofit.planner.token_caps); None for one that batches by samples."""
    longest = (knobs or {}).get("longest_sample")
    if not longest:
        return None
    return token_caps(options.token_range, longest)


def available_cores() -> int:
    """The cores this process may run on (its affinity, which a container or taskset may narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def loader_choices(settings: SearchSettings, knobs: dict | None) -> LoaderChoices:
    """The loader settings worth trying when the function offers run.loader(): worker counts within the
    cores one process of the real run has (per rank under --nproc-per-node) and a probe's share of them
    while several probe at once (more only compete for them), pinned memory on a GPU (the CPU copies
    nothing), and prefetching beyond DataLoader's default of 2."""
    if not knobs or not knobs.get("loader"):
        return LoaderChoices()
    loader_workers = loader_worker_counts(available_cores(), ranks_per_node=settings.nproc_per_node,
                                          probes_at_once=len(settings.worker_indices()))
    return LoaderChoices(workers=loader_workers,
                         pin_memory=(True,) if settings.device != "cpu" else (),
                         prefetch_factors=tuple(p for p in LOADER_PREFETCH if p != 2),
                         declared_workers=int(knobs.get("declared_workers") or 0))


def loader_note(settings: SearchSettings) -> str | None:
    """One line when probes side by side (--parallel N, several GPUs) kept the loader's workers below
    what the real run could use."""
    return shared_cores_loader_note(available_cores(), ranks_per_node=settings.nproc_per_node,
                                    probes_at_once=len(settings.worker_indices()))
