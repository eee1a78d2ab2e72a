"""torch.compile as a knob: compiled and eager probed as separate strategies, the compile time
reported apart from the step time, a failing compilation dropped like a failing precision."""

import json

import optuna
import pytest

import autofit
from autofit.config import Config
from autofit.export import config_entry, read_best, write_best
from autofit.study import trial_result
from tests.support import autofit_cli, script

pytestmark = pytest.mark.serial  # tight budgets or speeds measured (pyproject.toml)


def _search(tmp_path, name: str, *extra: str):
    storage = f"sqlite:///{tmp_path}/s.db"
    done = autofit_cli("search", script(name), "--memory-limit", "2GiB", "--budget", "4m", "--storage", storage,
                       "--study", "s", "--out", str(tmp_path / "best.json"), "--no-estimate", *extra, cwd=tmp_path,
                       timeout=400)
    results = [r for t in optuna.load_study(study_name="s", storage=storage).trials if (r := trial_result(t))]
    return done, results


@pytest.mark.compile
def test_compiled_and_eager_are_probed_and_told_apart(tmp_path):
    done, results = _search(tmp_path, "compiles.py", "--trials", "5", "--batch-size", "16:32")
    assert done.returncode == 0, done.stderr
    eager = [r for r in results if not r.config.compile]
    compiled = [r for r in results if r.config.compile]
    assert eager and compiled, [r.config.label() for r in results]
    assert all(r.config.label().endswith(" compiled") for r in compiled)
    ran = [r for r in compiled if r.ok]
    assert ran and all(r.compile_s is not None and r.compile_s > 0 for r in ran)
    assert all(r.warmup_s > r.compile_s for r in ran)  # measured steps hold none of it
    assert all(r.compile_s is None for r in eager)
    assert "compiled in" in done.stderr and "not counted" in done.stderr
    # The file holds the winner as the study ranks it, compiled or eager: a compiled winner read back
    # from the file must still say compile, or a normal run would train it eager.
    assert read_best(str(tmp_path / "best.json")).config == autofit.load_study("s", f"sqlite:///{tmp_path}/s.db").best()


@pytest.mark.compile
def test_a_compilation_that_fails_drops_compiled_strategies_and_the_search_goes_on(tmp_path):
    done, results = _search(tmp_path, "compile_fails.py", "--trials", "6")
    assert done.returncode == 0, done.stderr
    failed = [r for r in results if r.config.compile]
    assert len(failed) == 1 and failed[0].status == "error" and "cannot compile" in failed[0].error_message
    assert [r for r in results if not r.config.compile and r.ok]
    document = json.loads((tmp_path / "best.json").read_text())
    assert "compile" not in document["config"]  # eager won, and its config keeps its form


def _written_and_read_back(tmp_path, entry: dict) -> Config:
    path = write_best(str(tmp_path / "best.json"), {"config": entry, "measured": {}, "memory": {},
                                                    "device": {"type": "cpu"}, "versions": {}, "script": {}})
    return read_best(path).config


def test_a_compiled_config_is_written_to_the_best_config_file_and_read_back_compiled(tmp_path):
    compiled = Config(16, "bf16", accumulation_steps=2, compile=True)
    assert config_entry(compiled)["compile"] is True
    assert _written_and_read_back(tmp_path, config_entry(compiled)) == compiled
    assert _written_and_read_back(tmp_path, config_entry(Config(16))) == Config(16)


def test_a_best_config_file_without_compile_reads_as_eager(tmp_path):
    """Files written before compile was a knob, and every eager one, hold no `compile` field."""
    entry = config_entry(Config(8, "bf16"))
    assert "compile" not in entry
    assert _written_and_read_back(tmp_path, entry).compile is False


