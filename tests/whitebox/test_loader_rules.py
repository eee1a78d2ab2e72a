"""The input pipeline's rules checked directly: a probe in this process (autofit.probing._probe) under a fake clock
says how long its steps waited for data, a DataLoader's prefetch queue is drained in warm-up, and the loader
settings a search may try (autofit.search._space) and stores as trial params (autofit.search._sampler)."""

from __future__ import annotations

import importlib.util
import json

import torch

from autofit import Config
from autofit.devices import make_backend
from autofit.planner import (
    LoaderChoices,
    Observation,
    Planner,
    SearchSpace,
    shared_cores_loader_note,
    worker_counts,
)
from autofit.probing import INPUT_BOUND_SHARE, ProbeResult
from autofit.probing._probe import run_probe
from autofit.report import describe_probe
from autofit.search import SearchSettings
from autofit.search._sampler import space_distributions
from autofit.search._space import loader_choices, loader_note
from tests.support import script


# --- data wait in every probe ------------------------------------------------------------------
def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _probe(name: str) -> ProbeResult:
    """A real probe, in this process (torch is loaded already): a few steps of the script's loop."""
    module = _load(script(f"{name}.py"), f"{name}_probed")
    return run_probe(module.train_steps, Config(4), make_backend("cpu"), warmup_steps=1, measured_steps=5,
                     min_measure_s=0.05)


def test_a_probe_of_a_slow_loader_is_input_bound():
    """Each sample sleeps 2 ms to load while the step takes microseconds: nearly all of it is waiting."""
    probe = _probe("slow_loader")
    assert probe.ok, probe.error_message
    assert probe.data_wait_share > 0.5 and probe.data_wait_s > 0
    assert f"input-bound: {probe.data_wait_share:.0%} of the time waiting for data" in probe.summary()
    assert "input-bound:" in describe_probe(probe)


class _SlowSamples(torch.utils.data.Dataset):
    """10 ms to load a sample: a batch of 4 takes 40 ms of a worker's time, a step microseconds."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> torch.Tensor:
        import time

        time.sleep(0.01)
        return torch.ones(4)


def _prefetching_steps(run) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(_SlowSamples(), batch_size=run.batch_size, num_workers=2, prefetch_factor=8)
    for x in run.batches(loader):
        if run.optimizer_steps == 0:
            import time

            time.sleep(0.5)  # a first step's one-off costs (compilation, autotuning): the queue fills meanwhile
        run.backward(model(x).mean(), opt)


def test_a_loader_probe_measures_after_its_prefetch_queue_drained():
    """16 batches queued by 2 workers while the first step ran: measured from there, five steps would
    time the queue (2,800 samples/s measured) rather than the loading, which cannot supply more than
    2 workers x 4 samples per 40 ms = 200 samples/s. The warm-up takes the queue first."""
    probe = run_probe(_prefetching_steps, Config(4), make_backend("cpu"), warmup_steps=1, measured_steps=5,
                      min_measure_s=0)
    assert probe.ok, probe.error_message
    assert probe.warmup_steps == 1 + 2 * 8
    assert any("prefetch queue (2 workers x 8 batches) drained" in note for note in probe.notes)
    assert probe.samples_per_s < 2 * 200  # sleep() only ever lasts longer: 200/s is the loading's ceiling


def test_a_probe_of_data_in_memory_is_not():
    probe = _probe("fits_small")
    assert probe.ok, probe.error_message
    assert probe.data_wait_s is not None and probe.data_wait_share < INPUT_BOUND_SHARE
    assert "input-bound" not in probe.summary() and "input-bound" not in describe_probe(probe)


# --- the planner's loader rule (pure logic) ----------------------------------------------------
CHOICES = LoaderChoices(workers=(0, 1, 2, 4, 8), pin_memory=(True,), prefetch_factors=(4,), declared_workers=0)


def _space(choices: LoaderChoices = CHOICES) -> SearchSpace:
    return SearchSpace.build(batch_size=(8, 8), precisions=("fp32",), loader=choices)


def _seen(*probes: tuple[Config, float], share: float | None = 0.5) -> list[Observation]:
    """The leader (Config(8)) waiting `share` of its time, then each (config, samples/s)."""
    return [Observation(Config(8), "ok", 100, 100.0, data_wait_share=share),
            *(Observation(config, "ok", 100, rate, data_wait_share=0.1) for config, rate in probes)]


def _next(seen: list[Observation], choices: LoaderChoices = CHOICES) -> Config | None:
    return Planner(_space(choices), 1e9).next(seen)


def test_a_probe_tries_no_more_workers_than_its_share_of_the_cores(monkeypatch):
    """The workers a search tries are within the cores one process of the real run has (a node's cores
    over its ranks), and within a probe's share while several probe at once: waiting 90% of the step,
    the climb starts at the most it may try."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    knobs = {"loader": True, "declared_workers": 0}

    def first(**settings) -> int:
        choices = loader_choices(SearchSettings(script="train.py", **settings), knobs)
        return _next(_seen(share=0.9), choices).loader_workers

    assert first() == 8  # one process on 8 cores
    assert first(nproc_per_node=4) == 2  # 4 ranks, each with its loader, on 8 cores
    assert first(workers=2) == 4  # 2 probes at once share the 8 cores
    assert worker_counts(3, ranks_per_node=4) == (0,)  # fewer cores than ranks: load in the main process
    assert loader_note(SearchSettings(script="train.py", workers=2)) == (
        "loader workers were tried up to 4, not the 8 your run could use: 2 probes at once shared 8 cores; "
        "search with one worker to tune the loader fully")
    assert loader_note(SearchSettings(script="train.py")) is None
    assert shared_cores_loader_note(64, probes_at_once=2) is None  # 32 cores each: the whole ladder still


def test_a_space_without_the_loader_keeps_its_form_and_its_params():
    plain = SearchSpace.build(batch_size=(1, 64), precisions=("fp32",))
    assert "loader" not in plain.to_dict()
    assert not {"loader_workers", "pin_memory", "prefetch_factor"} & set(space_distributions(plain))
    offered = _space()
    assert SearchSpace.from_dict(json.loads(json.dumps(offered.to_dict()))) == offered
    assert {"loader_workers", "pin_memory", "prefetch_factor"} <= set(space_distributions(offered))
