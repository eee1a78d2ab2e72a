"""The space a search probes: the decorator's options with the command line's on top, the precisions
the device runs, and the knobs the training function offers. A search starts before it knows those
knobs; its first probe reports them, and the space narrows to what the function can change."""

from __future__ import annotations

import os

from autofit.config import LOADER_PREFETCH
from autofit.errors import UsageError
from autofit.knobs import Offers
from autofit.options import SearchOptions
from autofit.planner import (
    Asked,
    LoaderChoices,
    SearchSpace,
    compute_variants,
    knob_values,
    loader_worker_counts,
    shared_cores_loader_note,
    token_caps,
)
from autofit.probing import WorkerInfo
from autofit.search._settings import SearchSettings


def search_options(info: WorkerInfo, settings: SearchSettings) -> SearchOptions:
    """The decorator's options (as the worker read them from the script), overridden by the settings."""
    options = SearchOptions(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in info.options.items()}) \
        if info.options else SearchOptions()
    return options.merged(global_batch=settings.global_batch, batch_range=settings.batch_range,
                          precision=settings.precision, accumulation=settings.accumulation,
                          consider=settings.consider, compile=settings.compile, token_range=settings.token_range)


def build_space(settings: SearchSettings, options: SearchOptions, info: WorkerInfo, offers: Offers | None) -> SearchSpace:
    """The configs worth probing: each knob's values from what the function offers (`offers`: None until
    the first probe reports them, when the search assumes `Offers.assumed()`), the options and the device
    (autofit.planner's `knob_values`), over the sizes: the micro-batches (a loop's own batch alone where it
    reads no batch knob), or the token caps by tokens; the loader's settings and the compute knobs on the leader."""
    offers = offers or Offers.assumed()
    world = settings.world_size
    asked = Asked(offers, options, settings.device, world, tuple(info.precisions), tuple(info.default_precisions))
    global_batch = options.global_batch
    if global_batch and world > 1:  # the micro-batch and accumulation are per rank
        if global_batch % world:
            raise UsageError(f"The global batch must divide among the {world} ranks, but got {global_batch}.")
        global_batch //= world
    own = offers.own_batch
    return SearchSpace.build(batch_range=(own, own) if own else options.batch_range,
                             token_range=token_range(options, offers), global_batch=global_batch,
                             global_tokens=options.global_tokens, longest_sample=offers.longest_sample,
                             loader=loader_choices(settings, offers), variants=compute_variants(asked),
                             **knob_values(asked))


def token_range(options: SearchOptions, offers: Offers) -> tuple[int, int] | None:
    """For a function that batches by tokens (run.token_batches), the token caps to climb
    (autofit.planner.token_caps); None for one that batches by samples."""
    longest = offers.longest_sample
    if not longest:
        return None
    return token_caps(options.token_range, longest)


def available_cores() -> int:
    """The cores this process may run on (its affinity, which a container or taskset may narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def loader_choices(settings: SearchSettings, offers: Offers) -> LoaderChoices:
    """The loader settings worth trying when the function offers run.loader(): worker counts within the
    cores one process of the real run has (per rank under --nproc-per-node) and a probe's share of them
    while several probe at once (more only compete for them), pinned memory on a GPU (the CPU copies
    nothing), and prefetching beyond DataLoader's default of 2."""
    if not offers.loader:
        return LoaderChoices()
    loader_workers = loader_worker_counts(available_cores(), ranks_per_node=settings.nproc_per_node,
                                          probes_at_once=len(settings.worker_indices()))
    return LoaderChoices(workers=loader_workers,
                         pin_memory=(True,) if settings.device != "cpu" else (),
                         prefetch_factors=tuple(p for p in LOADER_PREFETCH if p != 2),
                         declared_workers=int(offers.declared_workers or 0))


def loader_note(settings: SearchSettings) -> str | None:
    """One line when probes side by side (--parallel N, several GPUs) kept the loader's workers below
    what the real run could use."""
    return shared_cores_loader_note(available_cores(), ranks_per_node=settings.nproc_per_node,
                                    probes_at_once=len(settings.worker_indices()))
