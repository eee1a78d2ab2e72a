"""Real searches on CPU under a memory limit, bounded by their probe counts (a roomy budget: they run beside
another test); the one whose budget is what it tests runs alone (`serial`)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import optuna
import pytest
from click.testing import CliRunner

from autofit.cli import cli
from autofit.config import Config
from autofit.export import read_best
from autofit.findings import observations
from autofit.planner import SearchSpace, Strategy
from autofit.search import SearchSettings, run_search
from autofit.study import open_storage
from tests.support import autofit_cli, script
from tests.support.studies import records_config_with_best

LIMIT = 768 * 2**20
TRIALS = 4


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """One real search shared by the tests that only read its outcome, bounded by its probe count. Its
    smallest batch, 128, runs out of memory in fp32 (about 1 GiB of activations) and fits in bf16 (about
    0.55 GiB): the search has an OOM to imply from and a config that fits."""
    home = tmp_path_factory.mktemp("search")
    cwd = os.getcwd()
    os.chdir(home)
    try:
        # bf16 asked for: a CPU without bf16 instructions leaves it out of its defaults (it is emulated there)
        result = run_search(SearchSettings(script=script("fits_small.py"), memory_limit=LIMIT, trials=TRIALS,
                                           budget_s=600, batch_range=(128, 1024), confirm_factor=2,
                                           precision=("fp32", "bf16")))
    finally:
        os.chdir(cwd)
    study = optuna.load_study(study_name=result.study_name, storage=open_storage(result.storage))
    return result, study, None, home


@pytest.mark.serial  # a budget of half a probe: its start must not be slowed by a neighbour
@pytest.mark.slow
def test_a_search_stops_probing_when_its_budget_cannot_hold_another_probe(tmp_path):
    """The budget prices the next probe from what the study's probes took: a resumed search whose whole budget
    is half of what its study's shortest probe took must start no probe, though larger micro-batches are left,
    and say why it stopped (half of a recorded wall, however fast or slow the machine ran it)."""
    base = dict(script=script("fits_small.py"), memory_limit=LIMIT, batch_range=(16, 64), estimate=False,
                storage=f"sqlite:///{tmp_path}/b.db", study="budget", out=str(tmp_path / "b.json"), confirm_factor=2)
    first = run_search(SearchSettings(trials=1, budget_s=600, **base))
    assert first.probes >= 1 and first.stopped == "reached --trials 1"
    study = optuna.load_study(study_name="budget", storage=open_storage(base["storage"]))
    shortest = min(o.wall_s for o in observations(study.trials))
    again = run_search(SearchSettings(budget_s=shortest / 2, **base))
    assert again.stopped == "the time budget"
    assert again.probes == first.probes and again.best == first.best  # the study's probes: none added


def test_search_exports_valid_json_with_a_feasible_config(searched):
    result, study, _, home = searched
    best = read_best(result.json_path)
    assert os.path.dirname(result.json_path) == str(home / "studies")
    usable = best.memory.usable_bytes
    assert best.memory.limit_bytes == LIMIT
    assert 0 < best.measured.peak_bytes <= usable
    assert best.config.batch_size == result.best.batch_size
    assert best.script.sha256 and best.versions["torch"]
    assert best.why.startswith(best.config.label())
    ok = [t for t in study.trials if t.user_attrs.get("status") == "ok"]
    assert ok and all(t.value > 0 for t in ok)


def test_search_never_probes_a_config_implied_infeasible(searched):
    """No probe after a too-big one at a batch as large or larger, under as much checkpointing or less."""
    _, study, _, _ = searched
    usable = study.user_attrs["autofit"]["usable_bytes"]
    seen = [o for trial in sorted(study.trials, key=lambda t: t.number) for o in observations([trial])]
    too_big = [o for o in seen if o.too_big(usable)]
    assert too_big, [o.config.label() for o in seen]  # the fixture's fp32 at batch 128: something to imply from
    implied = [(earlier.config.label(), later.config.label())
               for i, later in enumerate(seen) for earlier in seen[:i]
               if earlier.too_big(usable) and earlier.config.precision == later.config.precision
               and earlier.config.checkpoint_segments >= later.config.checkpoint_segments
               and later.config.batch_size >= earlier.config.batch_size]
    assert implied == []


def test_ooms_are_complete_infeasible_trials(searched):
    _, study, _, _ = searched
    usable = study.user_attrs["autofit"]["usable_bytes"]
    too_big = [t for t in study.trials if t.user_attrs.get("status") == "oom"
               or (t.user_attrs.get("status") == "ok" and t.user_attrs["probe"]["peak_bytes"] > usable)]
    assert too_big, [t.user_attrs.get("status") for t in study.trials]  # the fixture's fp32 at batch 128
    for t in too_big:
        assert t.state == optuna.trial.TrialState.COMPLETE
        assert t.constraints["memory"] > 0
    fits = [t for t in study.trials if t.user_attrs.get("status") == "ok" and t not in too_big]
    assert fits and all(t.constraints["memory"] <= 0 for t in fits)
    assert study.best_trial.user_attrs["status"] == "ok"  # Optuna's own best is a feasible trial


@pytest.mark.slow
def test_search_resumes_without_repeating_probes(tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    base = dict(script=script("fits_small.py"), memory_limit=LIMIT, budget_s=600, storage=storage,
                study="resume", out=str(tmp_path / "best.json"), batch_range=(1, 512), confirm_factor=2)
    first = run_search(SearchSettings(trials=2, **base))
    second = run_search(SearchSettings(trials=3, **base))
    study = optuna.load_study(study_name="resume", storage=storage)
    explored = [o.config for o in observations(study.trials) if o.phase == "explore"]
    first_explored = [o.config for o in observations(study.trials[: first.probes]) if o.phase == "explore"]
    assert len(explored) == len(set(explored)) > len(first_explored)  # resumed, nothing explored twice
    assert second.probes > first.probes


@pytest.mark.slow
def test_global_batch_is_respected(tmp_path):
    result = run_search(SearchSettings(script=script("fits_small.py"), memory_limit=LIMIT, budget_s=600,
                                       global_batch=96, trials=4, storage=f"sqlite:///{tmp_path}/g.db",
                                       out=str(tmp_path / "g.json")))
    study = optuna.load_study(study_name=result.study_name, storage=f"sqlite:///{tmp_path}/g.db")
    configs = [o.config for o in observations(study.trials)]
    assert configs and all(c.batch_size * c.accumulation_steps == 96 for c in configs)
    assert read_best(result.json_path).global_batch == 96


def test_decorated_function_called_normally_uses_the_exported_config(tmp_path):
    work = tmp_path / "proj"
    (work / "studies").mkdir(parents=True)
    shutil.copy(script("records_config.py"), work / "train.py")
    document = {
        "schema": "autofit.best-config", "schema_version": 1,
        "config": {"batch_size": 7, "accumulation_steps": 1, "precision": "bf16", "checkpoint_segments": 0},
        "measured": {}, "memory": {}, "device": {"type": "cpu", "name": "x"}, "versions": {},
        "script": {"path": str(work / "train.py"), "sha256": None},
    }
    (work / "studies" / "train.train.best.json").write_text(json.dumps(document))
    record = tmp_path / "record.json"
    env = {**os.environ, "RECORD_TO": str(record)}
    proc = subprocess.run([sys.executable, "train.py"], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    used = json.loads(record.read_text())
    assert used == {"batch_size": 7, "precision": "bf16", "probing": False, "steps": 3,
                    "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}  # a file of a CPU search records none
    assert "best config from studies/train.train.best.json" in proc.stderr


def test_decorated_function_without_a_result_runs_with_defaults_and_says_so(tmp_path):
    shutil.copy(script("records_config.py"), tmp_path / "train.py")
    record = tmp_path / "record.json"
    proc = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env={**os.environ, "RECORD_TO": str(record)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(record.read_text())["batch_size"] == 32
    assert "running with defaults" in proc.stderr


def test_corrupt_config_is_a_clear_error_not_a_default(tmp_path):
    shutil.copy(script("records_config.py"), tmp_path / "train.py")
    (tmp_path / "bad.json").write_text("{not json")
    env = {**os.environ, "RECORD_TO": str(tmp_path / "r.json"), "AUTOFIT_CONFIG": str(tmp_path / "bad.json")}
    proc = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "must be valid JSON" in proc.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("args,message", [
    (["--budget", "soon"], "Invalid value for '--budget'"),
    (["--batch-size", "64:8"], "Invalid value for '--batch-size'"),
    (["--global-batch", "97", "--batch-size", "2:64"], "no divisor"),
    (["--storage", "sqlite:////proc/nope/x.db"], "storage"),
    (["--storage", "nosuchdb://x"], "storage"),
    (["--precision", "fp32,tf32"], "tf32"),
])
def test_search_bad_input_is_one_line_and_exit_2_or_1(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)  # its default storage and the worker's log: never the checkout's studies/
    result = CliRunner().invoke(cli, ["search", script("fits_small.py"), "--budget", "30s", "--memory-limit", "768MiB",
                                      "--out", str(tmp_path / "b.json"), *args])
    assert result.exit_code in (1, 2), result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "b.json").exists()


@pytest.mark.slow
def test_search_spends_no_probes_on_knobs_the_function_ignores(tmp_path):
    result = run_search(SearchSettings(script=script("plain_loop.py"), memory_limit=LIMIT, budget_s=600, trials=3,
                                       storage=f"sqlite:///{tmp_path}/k.db", out=str(tmp_path / "k.json"),
                                       confirm_factor=2))  # bounded by its probe count, not a 60 s budget
    study = optuna.load_study(study_name=result.study_name, storage=f"sqlite:///{tmp_path}/k.db")
    probed = [o.config for o in observations(study.trials)]
    configs = set(probed)
    # three probes or more over two sizes at least (the climb to the memory edge may re-probe a slower size
    # rather than try a third): none of them spent on a precision or checkpointing
    assert len(probed) >= 3 and len(configs) >= 2
    assert {c.precision for c in configs} == {"fp32"}  # never entered run.autocast()
    assert {c.checkpoint_segments for c in configs} == {0}  # never offered blocks
    space = SearchSpace.from_dict(study.user_attrs["autofit"]["space"])
    assert space.values_of("precision") == ("fp32",) and space.strategies() == [Strategy()]  # one strategy: fp32


@pytest.mark.slow
def test_search_from_python_on_the_decorated_function(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location("grows_module", script("grows.py"))
    module = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(os.path.dirname(script("grows.py")))
    spec.loader.exec_module(module)
    result = module.train.search(budget="10m", memory_limit="768MiB", trials=3, confirm_factor=2)
    assert result.best is not None and result.json_path.endswith("studies/grows.train.cpu.best.json")
    frame = result.trials_frame()
    assert len(frame) == result.probes and set(frame["status"]) <= {"ok", "oom"}
    assert frame["samples_per_s"].dtype == "float64"


def test_changed_script_warns_when_the_config_is_loaded(tmp_path):
    records_config_with_best(tmp_path, script={"path": str(tmp_path / "train.py"), "sha256": "0" * 64})
    env = {**os.environ, "RECORD_TO": str(tmp_path / "r.json"), "AUTOFIT_CONFIG": str(tmp_path / "best.json")}
    proc = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "script changed since the search" in proc.stderr
    assert "allocator settings" not in proc.stderr  # none recorded: nothing to compare
    assert json.loads((tmp_path / "r.json").read_text())["batch_size"] == 5


@pytest.mark.slow
def test_a_run_applies_the_searchs_allocator_settings_and_is_warned_where_the_users_own_differ(tmp_path):
    records_config_with_best(tmp_path, script={"path": str(tmp_path / "train.py")},
                              allocator={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                                         "PYTORCH_ALLOC_CONF": None})
    env = {**os.environ, "RECORD_TO": str(tmp_path / "r.json"), "AUTOFIT_CONFIG": str(tmp_path / "best.json")}
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    applied = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120)
    assert applied.returncode == 0 and "allocator settings" not in applied.stderr, applied.stderr
    assert json.loads((tmp_path / "r.json").read_text())["alloc_conf"] == "expandable_segments:True"
    differs = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                             env={**env, "PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"})
    assert differs.returncode == 0, differs.stderr
    assert ("PYTORCH_CUDA_ALLOC_CONF was expandable_segments:True in the search and is "
            "garbage_collection_threshold:0.6 now") in differs.stderr
    assert json.loads((tmp_path / "r.json").read_text())["alloc_conf"] == "garbage_collection_threshold:0.6"


@pytest.mark.slow
def test_alloc_conf_reaches_the_probes_and_the_best_config(tmp_path):
    done = autofit_cli("search", script("prints_alloc_conf.py"), "--trials", "1", "--budget", "10m", "--no-estimate",
                       "--alloc-conf", "expandable_segments:True", "--storage", f"sqlite:///{tmp_path}/s.db",
                       "--study", "a", "--out", str(tmp_path / "best.json"), cwd=tmp_path,
                       env={"PYTORCH_CUDA_ALLOC_CONF": ""})
    assert done.returncode == 0, done.stderr
    document = json.loads((tmp_path / "best.json").read_text())
    assert document["allocator"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    logs = list((tmp_path / "runs" / "a").glob("trial-*.log"))
    assert logs and all("alloc conf: expandable_segments:True" in log.read_text() for log in logs)


def test_other_schema_version_is_refused(tmp_path):
    from autofit.errors import ConfigFileError

    (tmp_path / "v2.json").write_text(json.dumps({"schema": "autofit.best-config", "schema_version": 2}))
    with pytest.raises(ConfigFileError, match="schema version 1, but has 2"):
        read_best(str(tmp_path / "v2.json"))


def test_searches_on_two_kinds_of_device_keep_separate_answers():
    from autofit.export import default_best_path, device_tag

    cpu = default_best_path("train.py", "train", "studies", device_tag("cpu", "AMD EPYC (2 cores)"))
    h100 = default_best_path("train.py", "train", "studies", device_tag("cuda", "NVIDIA H100 80GB HBM3"))
    assert cpu == "studies/train.train.cpu.best.json"
    assert h100 == "studies/train.train.nvidia-h100-80gb-hbm3.best.json"


def test_a_batch_the_data_cannot_feed_stops_the_climb_without_blaming_the_precision():
    from autofit.config import MAX_BATCH
    from autofit.planner import Observation, Planner, SearchSpace

    space = SearchSpace.build(batch_range=(1, MAX_BATCH), precision=("fp32", "bf16"))
    planner = Planner(space, 100 * 2**30)

    def ok(b, precision="fp32"):
        return Observation(Config(batch_size=b, precision=precision), "ok", peak_bytes=2**30 + b * 2**20, rate=10.0 * b)

    seen = [ok(4), ok(64), ok(256), Observation(Config(batch_size=1024), "error", data_bound=True),
            Observation(Config(batch_size=1024, precision="bf16"), "error", data_bound=True)]
    proposals = []
    for _ in range(30):
        config = planner.next(seen)
        if config is None:
            break
        proposals.append(config)
        seen.append(ok(config.batch_size, config.precision))
    assert proposals and all(c.batch_size < 1024 for c in proposals)
    assert "bf16" in {c.precision for c in proposals}  # a data-bound probe is not the precision's failure
    assert planner.unusable_precisions(seen) == set()


def test_contenders_are_remeasured_as_ranked_before_and_the_first_is_confirmed_once():
    """The close contenders (within 5% of the best, the noise steps that spread 10% leave, measured once) keep
    the order they had before any remeasurement, however a remeasurement moves them; the confirmed first is
    not confirmed again."""
    from autofit.planner import Observation, Planner, SearchSpace

    planner = Planner(SearchSpace.build(batch_range=(1, 64), precision=("fp32",)), 2**30, check_noise=False)

    def probe(batch, rate, phase="explore"):
        return Observation(Config(batch_size=batch), "ok", peak_bytes=2**20 * batch, rate=rate, phase=phase, spread=0.10)

    seen = [probe(64, 100.0), probe(48, 97.0), probe(32, 96.0), probe(24, 95.5), probe(16, 90.0)]
    assert planner.contenders(seen) == [Config(batch_size=64), Config(batch_size=48), Config(batch_size=32)]
    seen.append(probe(64, 80.0, "remeasure"))  # the leader falls: 24 is now within 5% of the best, too late
    assert planner.contenders(seen) == [Config(batch_size=48), Config(batch_size=32)]
    seen += [probe(48, 97.0, "remeasure"), probe(32, 96.0, "remeasure")]
    assert planner.contenders(seen) == []
    first = planner.to_confirm(seen)
    assert first == planner.best(seen)
    seen.append(probe(first.batch_size, 97.0, "confirm"))
    assert planner.to_confirm(seen) is None


def test_the_best_config_carries_model_flops_and_a_null_mfu_on_cpu(searched):
    result, study, _, _ = searched
    measured = read_best(result.json_path).to_dict()["measured"]
    counted = [t.user_attrs["probe"]["flops_per_sample"] for t in study.trials if t.user_attrs.get("status") == "ok"]
    assert counted and all(c and c == counted[0] for c in counted)  # the model's, whatever the config
    assert measured["flops_per_sample"] == counted[0]
    assert measured["flops_per_s"] == pytest.approx(measured["samples_per_s"] * counted[0])
    assert measured["mfu"] is None and measured["joules_per_sample"] is None  # no dense peak, no NVML on a CPU


def test_every_line_the_search_ends_with_is_explained_on_the_failures_page(searched):
    """Issue 54: every note a search prints is on docs/guide/failures.md (tests/docs/test_failures_page.py holds
    every note in the source; this holds what a real search printed, figures and all)."""
    from autofit.report import describe_search
    from tests.support.message_sites import explained, page_text, printed_key

    result, study, _, _ = searched
    page = page_text()
    labels = sorted({o.config.label() for o in observations(study.trials)}, key=len, reverse=True)

    def key(line: str) -> str | None:  # a config's label is a figure as its numbers are ("bf16 b=192 ckpt=1 selective")
        for label in labels:
            line = line.replace(label, "0")
        return printed_key(line)

    lines = [line for line in describe_search(result).splitlines() if line.startswith("note: ")]
    assert len(lines) == len(result.notes)
    assert [line for line in lines if not explained(key(line), page)] == []
