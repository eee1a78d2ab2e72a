"""Every Config field survives every way a config travels: the best-config file, an Optuna trial's
params, a probe's record (the wire and the study), and the config a normal run trains with. A new field
that one of these drops fails here: the test's non-default values must name every field."""

from __future__ import annotations

import dataclasses
import json

import optuna
import pytest

from autofit import Config
from autofit.config import KNOB, KNOBS
from autofit.decorator import AutofitFunction
from autofit.export import BestConfig, config_entry, read_best, write_best
from autofit.normal_run import resolve_run_config
from autofit.options import SearchOptions
from autofit.probing import ProbeResult
from autofit.study import config_params, distributions, trial_config

#: A value other than the default for every field of Config.
NON_DEFAULT = {"batch_size": 24, "precision": "bf16", "checkpoint_segments": 2, "accumulation_steps": 3,
               "sharding": "fsdp", "compile": True, "loader_workers": 4, "pin_memory": True, "prefetch_factor": 4,
               "checkpoint_policy": "selective", "max_tokens": 64, "max_squares": 19200, "channels_last": True,
               "offload_activations": True, "pad_multiple": 64, "sdpa_backend": "flash"}
#: Fields that need another beside them: a squares cap bounds batches by tokens.
NEEDS = {"max_squares": {"max_tokens": 64}}


def test_the_non_default_values_name_every_config_field():
    fields = dataclasses.fields(Config)
    assert set(NON_DEFAULT) == {f.name for f in fields}
    for f in fields:
        if f.default is not dataclasses.MISSING:
            assert NON_DEFAULT[f.name] != f.default, f.name


CONFIGS = [Config(**NON_DEFAULT), Config(batch_size=8),
           *(Config(**{"batch_size": 8, **NEEDS.get(name, {}), name: value}) for name, value in NON_DEFAULT.items()
             if name != "batch_size")]


@pytest.fixture(params=CONFIGS, ids=lambda c: c.label().replace(" ", "_"))
def config(request) -> Config:
    return request.param


def _write(tmp_path, config: Config, world_size: int = 1, global_tokens: int | None = None) -> str:
    return write_best(str(tmp_path / "train.train.best.json"), BestConfig(
        config=config, world_size=world_size, global_tokens=global_tokens, device={"type": "cpu", "name": "cpu"}))


def _entry(path: str) -> dict:
    """The file's config entry, as it is on disk."""
    with open(path) as handle:
        return json.load(handle)["config"]


def test_the_best_config_file(tmp_path, config):
    assert read_best(_write(tmp_path, config)).config == config


def test_a_distributed_file_states_the_true_global_batch_and_the_per_rank_micro_batch(tmp_path):
    config = Config(batch_size=16, accumulation_steps=2)
    path = _write(tmp_path, config, world_size=4)
    best, entry = read_best(path), _entry(path)
    assert entry["global_batch"] == 16 * 2 * 4 and entry["ranks"] == 4 and entry["batch_size"] == 16
    assert entry["sharding"] == "ddp" and best.config == config  # the micro-batch read back is each rank's
    assert best.global_batch == 16 * 2 * 4 and best.world_size == 4
    one = _entry(_write(tmp_path, config))
    assert one["global_batch"] == 32 and "ranks" not in one and "sharding" not in one


def test_a_token_config_s_file_states_its_tokens_per_step_and_no_global_batch(tmp_path):
    """By tokens `batch_size` only caps a micro-batch's samples: a global batch from it would count nothing
    a step holds. The file says the real tokens per step the run keeps instead (None: not held)."""
    config = Config(batch_size=2048, accumulation_steps=2, max_tokens=2048)
    path = _write(tmp_path, config, world_size=4, global_tokens=65536)
    held, entry = read_best(path), _entry(path)
    assert entry["global_batch"] is None and entry["global_tokens"] == 65536 and entry["ranks"] == 4
    assert held.config == config and held.global_tokens == 65536 and held.global_batch is None
    assert _entry(_write(tmp_path, config))["global_tokens"] is None
    assert "global_tokens" not in config_entry(Config(batch_size=16), 4, global_tokens=65536)


def test_an_optuna_trial(config):
    params = config_params(config)
    trial = optuna.trial.create_trial(params=params, value=1.0, distributions={
        name: dist for name, dist in distributions((1, 64), 4, 8, offered={k.offer for k in KNOBS if k.offer and k.offer != KNOB["max_tokens"].offer},
                                                   token_range=(1, 128) if config.max_tokens else None).items()})
    assert trial_config(trial) == config


def test_a_probe_record(config):
    result = ProbeResult(status="ok", config=config, samples_per_s=10.0)
    assert ProbeResult.from_dict(result.to_dict()).config == config


def test_the_config_a_normal_run_trains_with(tmp_path, config, monkeypatch):
    """The exported file is exactly what runs: the run resolves the same config from the file."""
    path = _write(tmp_path, config)
    monkeypatch.setenv("AUTOFIT_CONFIG", path)
    fn = AutofitFunction(lambda run: None, SearchOptions())
    plan = resolve_run_config(fn, None, "cpu")
    assert plan.config == config and plan.path == path
    run = fn.make_run(plan=plan)
    assert run.config == config
    assert (run.batch_size, run.accumulation_steps, run.precision) == (
        config.batch_size, config.accumulation_steps, config.precision)
