"""The input pipeline's rules checked directly: a probe in this process (autofit.probing._probe) on a fake
clock says how long its steps waited for data, a DataLoader's prefetch queue is drained in warm-up, and the
loader settings a search may try (autofit.search._build_space) and stores as trial params (autofit.search._sampler)."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest
import torch

from autofit import Config
from autofit.devices import make_backend
from autofit.knobs import Offers
from autofit.planner import (
    LoaderChoices,
    Observation,
    Planner,
    SearchSpace,
    loader_worker_counts,
    shared_cores_loader_note,
)
from autofit.probing import INPUT_BOUND_SHARE, ProbeResult
from autofit.probing._probe import run_probe
from autofit.report import describe_probe
from autofit.search import SearchSettings
from autofit.search._build_space import loader_choices, loader_note
from autofit.search._sampler import space_distributions
from tests.support import script
from tests.support.clock import FakeClock


# --- data wait in every probe ------------------------------------------------------------------
def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    """Step timing on a fake clock: a step lasts what its fakes sleep (the steps' own work takes no time)."""
    return FakeClock().install(monkeypatch)


def _probe(fn, **steps) -> ProbeResult:
    """A real probe of `fn`, in this process (torch is loaded already): a few steps of its loop."""
    return run_probe(fn, Config(batch_size=4), make_backend("cpu"), **{"warmup_steps": 1, "measured_steps": 5, **steps})


def test_a_probe_of_a_slow_loader_is_input_bound(clock):
    """Each sample sleeps 2 ms to load (slow_loader.py) while the step takes no time: all of it is waiting.
    Five measured steps of 8 ms fall short of 50 ms; the seventh reaches it."""
    module = _load(script("slow_loader.py"), "slow_loader_probed")
    probe = _probe(module.train_steps, min_measure_s=0.05)
    assert probe.ok, probe.error_message
    assert probe.measured_steps == 7
    assert probe.data_wait_share == pytest.approx(1.0) and probe.data_wait_s == pytest.approx(7 * 4 * 0.002)
    assert f"input-bound: {probe.data_wait_share:.0%} of the time waiting for data" in probe.summary()
    assert "input-bound:" in describe_probe(probe)


#: A worker's time to load one sample: a batch of 4 takes one worker 40 ms.
LOAD_S = 0.01


class _QueuedLoader(torch.utils.data.DataLoader):
    """2 workers, each 8 batches ahead, played on the fake clock the way torch dispatches: batch i goes to
    worker i % 2 once batch i - 16 has been handed out (the queue's depth), and takes it 4 x LOAD_S. The
    loading cannot supply more than 2 workers x 4 samples per 40 ms = 200 samples/s."""

    def __init__(self, clock: FakeClock, batch_size: int) -> None:
        super().__init__(range(4096), batch_size=batch_size, num_workers=2, prefetch_factor=8)
        self.clock = clock

    def __iter__(self):
        depth = self.num_workers * self.prefetch_factor
        start, ready, handed = self.clock.now, [], []
        for i in range(len(self)):
            dispatched = handed[i - depth] if i >= depth else start
            worker_free = ready[i - self.num_workers] if i >= self.num_workers else start
            ready.append(max(dispatched, worker_free) + self.batch_size * LOAD_S)
            self.clock.advance_to(ready[i])  # the training process waits for batch i
            handed.append(self.clock.now)
            yield torch.ones(self.batch_size, 4)


def test_a_loader_probe_measures_after_its_prefetch_queue_drained(clock):
    """16 batches queued by 2 workers while the first step ran (0.5 s of one-off costs: compilation,
    autotuning): measured from there, five steps would time the queue (every batch ready, no time at all)
    rather than the loading. The warm-up takes the queue first, so the measured rate is the loading's."""

    def prefetching_steps(run) -> None:
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x in run.batches(_QueuedLoader(clock, run.batch_size)):
            if run.optimizer_steps == 0:
                time.sleep(0.5)  # the fake clock's: the queue fills meanwhile
            run.backward(model(x).mean(), opt)

    probe = _probe(prefetching_steps, min_measure_s=0)
    assert probe.ok, probe.error_message
    assert probe.warmup_steps == 1 + 2 * 8
    assert any("prefetch queue (2 workers x 8 batches) drained" in note for note in probe.notes)
    # Batches arrive two at a time every 40 ms, so five steps measure 250 samples/s; the queue would have
    # measured no time at all (an endless rate).
    assert 0 < probe.samples_per_s < 2 * 200


def test_a_probe_of_data_in_memory_is_not(clock):
    """Batches from a list wait for nothing while each step computes (10 ms on the fake clock)."""

    def in_memory_steps(run) -> None:
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x in run.batches([torch.ones(run.batch_size, 4)] * 64):
            time.sleep(0.01)
            run.backward(model(x).mean(), opt)

    probe = _probe(in_memory_steps, min_measure_s=0)
    assert probe.ok, probe.error_message
    assert probe.data_wait_s == 0 and probe.data_wait_share == 0 < INPUT_BOUND_SHARE
    assert "input-bound" not in probe.summary() and "input-bound" not in describe_probe(probe)


# --- the planner's loader rule (pure logic) ----------------------------------------------------
CHOICES = LoaderChoices(workers=(0, 1, 2, 4, 8), pin_memory=(True,), prefetch_factors=(4,), declared_workers=0)


def _space(choices: LoaderChoices = CHOICES) -> SearchSpace:
    return SearchSpace.build(batch_range=(8, 8), precision=("fp32",), loader=choices)


def _seen(*probes: tuple[Config, float], share: float | None = 0.5) -> list[Observation]:
    """The leader (Config(8)) waiting `share` of its time, then each (config, samples/s)."""
    return [Observation(Config(batch_size=8), "ok", 100, 100.0, data_wait_share=share),
            *(Observation(config, "ok", 100, rate, data_wait_share=0.1) for config, rate in probes)]


def _next(seen: list[Observation], choices: LoaderChoices = CHOICES) -> Config | None:
    return Planner(_space(choices), 1e9).next(seen)


def test_a_probe_tries_no_more_workers_than_its_share_of_the_cores(monkeypatch):
    """The workers a search tries are within the cores one process of the real run has (a node's cores
    over its ranks), and within a probe's share while several probe at once: waiting 90% of the step,
    the climb starts at the most it may try."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    knobs = Offers(loader=True, declared_workers=0)

    def first(**settings) -> int:
        choices = loader_choices(SearchSettings(script="train.py", **settings), knobs)
        return _next(_seen(share=0.9), choices).loader_workers

    assert first() == 8  # one process on 8 cores
    assert first(nproc_per_node=4) == 2  # 4 ranks, each with its loader, on 8 cores
    assert first(parallel=2) == 4  # 2 probes at once share the 8 cores
    assert loader_worker_counts(3, ranks_per_node=4) == (0,)  # fewer cores than ranks: load in the main process
    assert loader_note(SearchSettings(script="train.py", parallel=2)) == (
        "loader workers were tried up to 4, not the 8 your run could use: 2 probes at once shared 8 cores; "
        "search one probe at a time (--parallel 1) to tune the loader fully")
    assert loader_note(SearchSettings(script="train.py")) is None
    assert shared_cores_loader_note(64, probes_at_once=2) is None  # 32 cores each: the whole ladder still


def test_a_space_without_the_loader_keeps_its_form_and_its_params():
    plain = SearchSpace.build(batch_range=(1, 64), precision=("fp32",))
    assert "loader" not in plain.to_dict()
    assert not {"loader_workers", "pin_memory", "prefetch_factor"} & set(space_distributions(plain))
    offered = _space()
    assert SearchSpace.from_dict(json.loads(json.dumps(offered.to_dict()))) == offered
    assert {"loader_workers", "pin_memory", "prefetch_factor"} <= set(space_distributions(offered))
