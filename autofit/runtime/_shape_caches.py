"""What libraries keep for each shape a run meets, bounded on the CPU for every run, in its probes and its normal
run alike: batches by tokens meet a new shape at almost every batch, and so do fixed batches of variable lengths
padded to each batch's longest.

oneDNN, which PyTorch's CPU matmuls run on in bf16, keeps a primitive for each shape it met (1024 at most), and
PyTorch's mkldnn layer (ideep) a cache of its own (`LRU_CACHE_CAPACITY`, 1024 entries); each entry holds
buffers sized by its shape (pytorch/pytorch#27971, #32037; oneDNN#489). A length-sorted epoch by tokens meets a
new shape at almost every batch, a probe a few: a whole epoch of a small LM in bf16 held 1.38 GiB between steps
by step 40 where its probes peaked at 0.81 GiB, and ran out of memory (issue 53). Measured on a 2-core AMD EPYC
with AVX512-BF16 (2026-12-04; that LM, 40 new shapes then 20 again): the caches bounded as here kept the same
speed (354 against 361 ms a step; a new shape then costs what it did) and held 470 MiB where unbounded they held
768 MiB after the heap's free pages went back.

A fixed bf16 batch of one sample over the token benchmark's 250 lengths (benchmarks/tokens_study.py --fixed) peaked
at 1.82 GiB unbounded and 0.51 GiB bounded; under a 1 GiB cap its unbounded probe died of SIGSEGV (2026-12-05).

The bounds are set in the process's environment where the user's does not set them, as the run begins: both
libraries read them when they make their first primitive, which a run does in its first step (a script that ran a
oneDNN matmul before keeps the libraries' own sizes, in its probes as in its run). A probe meets enough shapes to
fill them, so its peak holds them full; the probes' bounds are recorded with the token envelope in the best-config
file, and a normal run sets the same.
"""

from __future__ import annotations

import os

import torch

#: Each cache's capacity where the environment sets none: enough for a step of a model with a dozen distinct
#: matmul shapes (forward and both backward products), few enough that a probe's shapes fill them.
DEFAULT_CAPACITIES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": 128, "LRU_CACHE_CAPACITY": 32}


def bound_shape_caches(device: torch.device, recorded: dict[str, int] | None = None,
                       set_here: list[str] | None = None) -> dict[str, int] | None:
    """On the CPU, each cache's capacity in force for this run: the user's (the environment's) where set, else
    `recorded` (the probes', from the best-config file) or the default, set in the environment (its name added
    to `set_here`: the run takes it out again when it ends, the libraries having read it); None on another
    device (a GPU's libraries keep their plans beyond any setting)."""
    if device.type != "cpu":
        return None
    capacities = {}
    for name, default in DEFAULT_CAPACITIES.items():
        own = os.environ.get(name, "").strip()
        if own.isdigit():
            capacities[name] = int(own)
            continue
        capacities[name] = int((recorded or {}).get(name, default))
        os.environ[name] = str(capacities[name])
        if set_here is not None:
            set_here.append(name)
    return capacities
