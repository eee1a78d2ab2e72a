"""A probe on a GPU of a function that trains on the CPU (nanoGPT's `--device=cpu` on a GPU machine) once read
"ok" at every batch: its peak was the CUDA context alone, so the search climbed to the top of the range and
exported a fit it never measured. A CUDA probe that allocated nothing on its device now fails, saying so (the
CUDA backend against the fakes of torch.cuda and NVML, tests/whitebox/fake_cuda.py)."""

from __future__ import annotations

import torch

from autofit.config import Config
from autofit.devices._cuda import CudaBackend
from autofit.planner import Observation, Planner, SearchSpace
from autofit.probing._probe import run_probe

GiB = 2**30


def trains_on_the_cpu(run) -> None:
    """Ignores run.device: its model and its batches stay on the CPU; its own loop, steps counted by autofit."""
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    while True:
        model(torch.randn(run.batch_size, 4)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def _probe(batch: int):
    return run_probe(trains_on_the_cpu, Config(batch_size=batch), CudaBackend(0), warmup_steps=1, measured_steps=2,
                     min_measure_s=0)


def test_a_cuda_probe_that_allocated_nothing_on_its_device_is_no_fit_and_the_search_does_not_climb(fake_cuda, nvml):
    fake_cuda.stats = {"allocation.all.allocated": 0}  # the caching allocator's count since the probe's start
    planner = Planner(SearchSpace.build(batch_range=(1, 64), precision=("fp32",)), 70 * GiB)
    done, results = [], []
    while (config := planner.next(done)) is not None and len(done) < 4:
        results.append(_probe(config.batch_size))
        done.append(Observation(config, results[-1].status, peak_bytes=results[-1].peak_bytes,
                                rate=results[-1].samples_per_s))
    assert results and all(r.status == "error" and r.error_type == "NothingOnDevice" for r in results)
    assert "allocated nothing on cuda:0" in results[0].error_message and "run.device" in results[0].error_message
    assert planner.next(done) is None and max(o.config.batch_size for o in done) < 64  # no climb: the search ends
    fake_cuda.stats = {"allocation.all.allocated": 12}  # the same loop, had it put its tensors on the GPU
    assert _probe(8).ok
    fake_cuda.stats, fake_cuda.allocator_backend = {}, "cudaMallocAsync"  # keeps no count: nothing is concluded
    assert _probe(8).ok
