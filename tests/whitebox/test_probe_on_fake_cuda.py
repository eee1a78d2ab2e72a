"""A probe run in this process on the CUDA backend over fakes of torch.cuda and NVML (tests/whitebox/conftest.py):
the allocator's retries read over its measured steps alone, and an activation offload's pinned memory gone when
the probe ends. The function trains on the CPU (nothing here reaches for a GPU); the fakes say what torch.cuda
would. What a fake proves: autofit reads the counters where it should, drops every host copy it made and asks
torch to give the host allocator's cache back; not that CUDA unpins (scripts/check_cuda.py reads that on a GPU)."""

from __future__ import annotations

import torch

from autofit.config import Config
from autofit.devices._cuda import CudaBackend
from autofit.probing._probe import run_probe
from autofit.runtime import Run, offload_transport
from tests.support.offload import Recording
from tests.whitebox.fake_cuda import GiB


def _own_loop(stats: dict, retries_per_step: int = 0):
    """A function with its loop of its own (followed through its optimizer's steps), over blocks it offers to
    run.checkpoint(); each step makes the fake allocator count `retries_per_step` retries."""

    def train(run: Run) -> None:
        torch.manual_seed(0)
        blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()) for _ in range(3)])
        run.checkpoint(blocks)
        opt = torch.optim.SGD(blocks.parameters(), lr=0.01)
        while True:
            h = torch.randn(run.batch_size, 8)
            for block in blocks:
                h = block(h)
            h.square().mean().backward()
            opt.step()
            opt.zero_grad()
            stats["num_alloc_retries"] = stats.get("num_alloc_retries", 0) + retries_per_step

    return train


def _probe(fake_cuda, train, config: Config):
    fake_cuda.stats["allocation.all.allocated"] = 1  # the function allocated on its device, as the fake says
    return run_probe(train, config, CudaBackend(0), warmup_steps=2, measured_steps=3, min_measure_s=0)


def test_a_probe_counts_the_retries_of_its_measured_steps_alone_and_says_so(nvml, fake_cuda):
    fake_cuda.stats["num_alloc_retries"] = 5  # before the probe: the fake keeps them (reset_peak is a fake)
    calm = _probe(fake_cuda, _own_loop(fake_cuda.stats), Config(batch_size=4))
    assert calm.ok and calm.alloc_retries == 0 and not calm.only_just_fits
    assert calm.allocator["num_alloc_retries"] == 5  # the whole probe's count is kept beside it
    tight = _probe(fake_cuda, _own_loop(fake_cuda.stats, retries_per_step=2), Config(batch_size=4))
    assert tight.ok and tight.alloc_retries == 2 * tight.measured_steps and tight.only_just_fits
    assert [n for n in tight.notes if "retried" in n] == [
        f"the allocator freed its cache and retried {tight.alloc_retries} allocations in the measured steps: this "
        f"config only just fits, and its speed pays for it"]
    assert "(only just fits: allocator retries)" in tight.summary()


def test_an_offloads_pinned_memory_is_released_when_its_probe_ends(nvml, fake_cuda):
    fake_cuda.host_stats = {"allocated_bytes.peak": 1 * GiB, "allocated_bytes.current": 0}
    transport = Recording()
    with offload_transport(lambda device: transport):
        result = _probe(fake_cuda, _own_loop(fake_cuda.stats), Config(batch_size=4, offload_activations=True))
    assert result.ok, result.error_message
    assert transport.hosts and transport.live_host_copies() == 0  # autofit holds no host copy after the probe
    assert fake_cuda.calls[-1] == "empty_host_cache"  # and torch's host cache was given back last
    assert "reset_peak_host_memory_stats" in fake_cuda.calls
    assert result.host_pinned_bytes == 1 * GiB and "(pinned host 1.00 GiB)" in result.summary()
