"""The input pipeline: every probe says how long its steps waited for data (`data_wait_s`,
`data_wait_share`), `run.loader()` builds the DataLoader from the config over what the script declares,
and a search probes loader settings on the leader when its probes waited for data."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from click.testing import CliRunner

from autofit import Config
from autofit.cli import cli
from autofit.errors import UsageError
from autofit.export import MemoryBudget, read_best
from autofit.findings import explain
from autofit.planner import (
    MIN_LOADER_SHARE,
    LoaderChoices,
    Observation,
    Planner,
    SearchSpace,
)
from autofit.runtime import Run, StepClock
from tests.support import autofit_cli, probe_result, script

pytestmark = pytest.mark.serial  # tight budgets or speeds measured (pyproject.toml)


# --- data wait in every probe ------------------------------------------------------------------
def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_normal_run_of_a_slow_loader_says_it_is_input_bound(monkeypatch, capsys):
    """The user's own run (no search) ends with the same verdict a probe gives."""
    monkeypatch.setenv("AUTOFIT_TEST_SAMPLES", "96")
    monkeypatch.delenv("AUTOFIT_CONFIG", raising=False)
    module = _load(script("slow_loader.py"), "slow_loader_normal")
    module.train()
    said = capsys.readouterr().err
    assert "samples/s after" in said and "of the time waiting for data)" in said, said


@pytest.mark.slow  # 10 s alone (the module is serial): the default tier keeps under 5 minutes
def test_the_probe_json_carries_the_data_wait(tmp_path):
    code, result = probe_result("slow_loader.py", "1GiB", 4, tmp_path)
    assert code == 0, result
    assert result["data_wait_s"] > 0 and 0 < result["data_wait_share"] <= 1  # a 2 ms sleep per sample waits


def test_only_the_measured_steps_wait_counts():
    """Waits before the clock starts and during warm-up are left out; each measured step's counts."""
    clock = StepClock(warmup_steps=2, measured_steps=None, synchronize=lambda: None)
    clock.data_waited(5.0)  # the first fetch, before the clock starts
    clock.start()
    for waited in (1.0, 2.0, 0.25, 0.5):  # two warm-up steps, then two measured
        clock.data_waited(waited)
        clock.step_done(samples=1, tokens=0)
    assert clock.data_wait_s == 0.75


def test_a_loop_autofit_does_not_drive_has_no_data_wait():
    run = Run(Config(batch_size=4))
    run.control.adopt_loop()
    for _ in range(3):
        run.control.step_taken(4)
    assert run.control.clock.data_wait_s is None and run.control.clock.data_wait_share is None


def test_run_batches_times_the_fetches():
    run = Run(Config(batch_size=2), warmup_steps=1)
    for _ in run.batches([torch.zeros(2, 3)] * 4):
        pass
    assert run.control.clock.data_wait_s is not None and run.control.summary()["data_wait_share"] is not None


# --- run.loader --------------------------------------------------------------------------------
class _Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int):
        return torch.tensor([float(index * index)])


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(torch.tensor([float(i)]) for i in range(32))


def test_the_config_overrides_what_the_script_declares():
    run = Run(Config(batch_size=8, loader_workers=2, pin_memory=False, prefetch_factor=4))
    loader = run.loader(_Squares(), num_workers=0, pin_memory=True, prefetch_factor=3)
    assert (loader.num_workers, loader.pin_memory, loader.prefetch_factor) == (2, False, 4)
    assert loader.batch_size == 8 and loader.drop_last
    assert isinstance(loader.sampler, torch.utils.data.DistributedSampler)
    assert run.control.knobs.loader and run.control.knobs.declared_workers == 0


def test_what_the_script_declares_holds_where_the_config_says_nothing():
    run = Run(Config(batch_size=8))
    loader = run.loader(_Squares(), num_workers=1, prefetch_factor=3, drop_last=False, shuffle=False)
    assert (loader.num_workers, loader.prefetch_factor, loader.drop_last) == (1, 3, False)
    assert run.control.knobs.declared_workers == 1
    default = Run(Config(batch_size=8)).loader(_Squares())
    assert (default.num_workers, default.pin_memory, default.prefetch_factor) == (0, False, None)


def test_the_training_loader_declares_the_workers_not_a_later_evaluation_one():
    """A script building its training loader, then an evaluation one, is searched from the training one's
    workers: those are the batches the probe measures."""
    run = Run(Config(batch_size=8))
    train = run.loader(_Squares(), num_workers=2)
    run.loader(_Squares(), shuffle=False, num_workers=0)  # evaluation
    assert run.control.knobs.declared_workers == 2
    next(run.batches(train))
    assert run.control.knobs.declared_workers == 2


def test_the_loader_run_batches_consumes_declares_the_workers_whichever_was_built_first():
    run = Run(Config(batch_size=8))
    run.loader(_Squares(), shuffle=False, num_workers=0)  # evaluation, built first
    train = run.loader(_Squares(), num_workers=1)
    next(run.batches(train))
    assert run.control.knobs.declared_workers == 1


def test_a_config_without_workers_drops_what_needs_them():
    """The script's prefetch and persistent workers need workers: DataLoader would refuse them."""
    loader = Run(Config(batch_size=8, loader_workers=0)).loader(_Squares(), num_workers=4, prefetch_factor=4,
                                                     persistent_workers=True)
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers) == (0, None, False)


def test_a_probe_keeps_no_worker_alive_and_an_iterable_gets_no_sampler():
    loader = Run(Config(batch_size=8), probing=True).loader(_Squares(), num_workers=1, persistent_workers=True)
    assert not loader.persistent_workers
    stream = Run(Config(batch_size=8)).loader(_Stream())
    assert not isinstance(stream.sampler, torch.utils.data.DistributedSampler)
    assert [batch.shape[0] for batch in stream] == [8] * 4


@pytest.mark.parametrize(("fields", "message"), [
    ({"loader_workers": -1}, "loader workers must be 0 or more"),
    ({"prefetch_factor": 0}, "prefetch factor must be at least 1"),
    ({"loader_workers": 0, "prefetch_factor": 2}, "prefetch factor needs loader workers"),
])
def test_bad_loader_fields_are_refused(fields, message):
    with pytest.raises(UsageError, match=message):
        Config(batch_size=8, **fields)


def test_the_loader_fields_in_the_label_and_the_dict():
    config = Config(batch_size=8, loader_workers=4, pin_memory=True)
    assert config.label() == "fp32 b=8 loader-workers=4 pinned"
    assert "prefetch_factor" not in config.to_dict() and "loader_workers" not in Config(batch_size=8).to_dict()
    assert Config.from_dict(config.to_dict()) == config


def test_the_probe_command_takes_the_loader_flags():
    bad = CliRunner().invoke(cli, ["probe", script("slow_loader.py"), "--batch-size", "4",
                                   "--loader-workers", "0", "--prefetch-factor", "2"])
    assert bad.exit_code == 2 and "prefetch factor needs loader workers" in bad.output
    assert "Traceback" not in bad.output


# --- the search chooses the loader -------------------------------------------------------------
@pytest.mark.slow
def test_a_search_of_an_input_bound_function_exports_loader_workers_and_a_run_trains_with_them(tmp_path, monkeypatch):
    best = tmp_path / "best.json"
    done = autofit_cli("search", script("slow_loader.py"), "--memory-limit", "1GiB", "--budget", "3m",
                       "--batch-size", "8:8", "--storage", f"sqlite:///{tmp_path}/s.db", "--out", str(best),
                       "--no-estimate", cwd=tmp_path, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "input-bound:" in done.stderr
    chosen = read_best(str(best))
    assert chosen.config.loader_workers and chosen.config.loader_workers > 0, done.stderr[-3000:]
    assert "input-bound:" in chosen.why and "workers" in chosen.why
    assert chosen.measured.data_wait_share > 0
    storage = f"sqlite:///{tmp_path}/s.db"
    shown = autofit_cli("show", "--storage", storage, cwd=tmp_path)
    assert "input-bound:" in shown.stdout.split("best:")[1], shown.stdout  # the winner's line
    reported = autofit_cli("report", "--storage", storage, "--out", str(tmp_path / "r.html"), cwd=tmp_path)
    assert reported.returncode == 0 and "Input-bound:" in (tmp_path / "r.html").read_text()
    # A normal run with the exported file trains with the chosen workers.
    monkeypatch.setenv("AUTOFIT_CONFIG", str(best))
    monkeypatch.setenv("AUTOFIT_TEST_SAMPLES", "64")
    report = tmp_path / "run.json"
    monkeypatch.setenv("AUTOFIT_RUN_REPORT", str(report))
    module = _load(script("slow_loader.py"), "slow_loader_run")
    module.train()
    assert module.LOADERS[-1].num_workers == chosen.config.loader_workers
    assert json.loads(report.read_text())["optimizer_steps"] == 64 // 8


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


def test_the_first_worker_count_is_the_one_that_could_keep_pace():
    """Waiting half the step, one worker loading beside the step keeps pace; waiting 80%, four."""
    assert _next(_seen(share=0.5)) == Config(batch_size=8, loader_workers=1)
    assert _next(_seen(share=0.8)) == Config(batch_size=8, loader_workers=4)


def test_the_workers_climb_while_faster_then_prefetch_then_pinning_then_done():
    four, eight = Config(batch_size=8, loader_workers=4), Config(batch_size=8, loader_workers=8)
    deeper = Config(batch_size=8, loader_workers=4, prefetch_factor=4)
    pinned = Config(batch_size=8, loader_workers=4, prefetch_factor=4, pin_memory=True)
    seen = _seen(share=0.8)
    assert _next(seen) == four
    seen = _seen((four, 250.0), share=0.8)
    assert _next(seen) == eight
    seen = _seen((four, 250.0), (eight, 240.0), share=0.8)  # no faster: the climb stops at 4
    assert _next(seen) == deeper
    seen = _seen((four, 250.0), (eight, 240.0), (deeper, 300.0), share=0.8)
    assert _next(seen) == pinned
    seen = _seen((four, 250.0), (eight, 240.0), (deeper, 300.0), (pinned, 290.0), share=0.8)
    assert _next(seen) is None
    assert Planner(_space(), 1e9).best(seen) == deeper


def test_no_loader_probe_where_fixing_the_loader_could_not_pay():
    assert _next(_seen(share=MIN_LOADER_SHARE / 2)) is None
    assert _next(_seen(share=None)) is None  # a study recorded before the data wait was measured
    assert _next(_seen(share=0.9), LoaderChoices()) is None  # the function does not offer run.loader()


def test_a_variant_running_elsewhere_is_waited_for():
    seen = [*_seen(share=0.8), Observation(Config(batch_size=8, loader_workers=4), "running")]
    assert _next(seen) is None


def test_the_cpu_tries_no_pinning_and_declared_workers_are_not_tried_again():
    choices = LoaderChoices(workers=(0, 1, 2), prefetch_factors=(4,), declared_workers=2)
    # Nothing above the declared two workers: only prefetching further is left, on the leader.
    assert _next(_seen(share=0.8), choices) == Config(batch_size=8, prefetch_factor=4)
    seen = _seen((Config(batch_size=8, prefetch_factor=4), 101.0), share=0.8)
    assert _next(seen, choices) is None


def test_why_says_the_loader_was_chosen():
    two = Config(batch_size=8, loader_workers=2)
    seen = _seen((two, 160.0), share=0.38)
    planner = Planner(_space(), 1e9)
    why = explain(planner.ranked(seen), seen, planner, 1e9)
    assert "input-bound: 38% of the step waiting for data with 0 loader workers; 2 loader workers: 1.6x" in why


@pytest.mark.slow  # 10 s: the default tier stays near 5 minutes
def test_a_micro_batch_larger_than_the_data_is_a_data_ceiling_not_a_faster_config():
    """48 samples: at 64 the loader gives one batch of 48 per epoch, which a probe would time as a
    config of 64 (and a search export as one): it is the data's ceiling instead."""
    from autofit.config import Config
    from autofit.probing import Worker

    with Worker(script("small_data.py"), budget=MemoryBudget(limit_bytes=1024 * 2**20)) as worker:
        fits, capped = (worker.probe(Config(batch_size=batch), warmup=1, steps=2, timeout=120) for batch in (48, 64))
    assert fits.status == "ok", fits.error_message
    assert capped.status == "error" and capped.error_type == "DataTooSmall", capped.error_message
    assert "batches of 48 samples at most, fewer than the micro-batch of 64" in capped.error_message
