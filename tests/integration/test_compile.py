"""torch.compile as a knob: compiled and eager probed as separate strategies, the compile time
reported apart from the step time, a failing compilation dropped like a failing precision."""

import json

import optuna
import pytest

import autofit
from autofit.config import Config
from autofit.export import BestConfig, config_entry, read_best, write_best
from autofit.study import trial_result
from tests.support import autofit_cli, script


def _search(tmp_path, name: str, *extra: str):
    storage = f"sqlite:///{tmp_path}/s.db"
    done = autofit_cli("search", script(name), "--memory-limit", "2GiB", "--budget", "4m", "--storage", storage,
                       "--study", "s", "--out", str(tmp_path / "best.json"), "--no-estimate", *extra, cwd=tmp_path,
                       timeout=400)
    results = [r for t in optuna.load_study(study_name="s", storage=storage).trials if (r := trial_result(t))]
    return done, results


@pytest.mark.serial  # their speeds are compared
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


def _written_and_read_back(tmp_path, config: Config) -> Config:
    path = write_best(str(tmp_path / "best.json"), BestConfig(config=config, device={"type": "cpu"}))
    return read_best(path).config


def test_a_compiled_config_is_written_to_the_best_config_file_and_read_back_compiled(tmp_path):
    compiled = Config(batch_size=16, precision="bf16", accumulation_steps=2, compile=True)
    assert config_entry(compiled)["compile"] is True
    assert _written_and_read_back(tmp_path, compiled) == compiled
    assert _written_and_read_back(tmp_path, Config(batch_size=16)) == Config(batch_size=16)


def test_a_best_config_file_without_compile_reads_as_eager(tmp_path):
    """Files written before compile was a knob, and every eager one, hold no `compile` field."""
    eager = Config(batch_size=8, precision="bf16")
    assert "compile" not in config_entry(eager)
    assert _written_and_read_back(tmp_path, eager).compile is False




@pytest.mark.compile
def test_in_one_process_a_probe_after_the_first_compiles_from_the_compilers_caches(tmp_path, monkeypatch):
    """CUDA's process model: every probe in one worker, TorchDynamo reset between them (a probe must compile as
    the real run will, not at a shape another probe left behind), and inductor's and AOTAutograd's caches kept
    (they are on disk): the second probe of a config takes its graphs from them, and both say how long
    compilation took, apart from their steps. The worker stays: its first compiled probe grows it once (248 to
    363 MiB here, compiled modules and all) and later ones end where it did (363, 365, 365)."""
    from autofit.probing import Worker

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # cold for the first probe
    with Worker(script("compiles.py"), probe_process="persistent") as worker:
        worker.start()
        first, second = (worker.probe(Config(batch_size=16, compile=True), timeout=300) for _ in range(2))
        assert worker.starts == 1 and worker.alive and not first.notes + second.notes
    assert first.ok and second.ok
    assert first.compile_s and second.compile_s is not None
    assert not first.compile_cache_hits and second.compile_cache_hits > 0


@pytest.mark.compile
def test_a_scripts_own_compilation_is_timed_apart_from_its_steps(tmp_path, monkeypatch):
    """nanoGPT compiles its model itself and evaluates it before its first step: the probe's start (before
    its first micro-batch ended) holds that, and its compilation is timed whoever asked for it."""
    from autofit.probing import Worker

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    with Worker(script("compiles_itself.py")) as worker:
        worker.start()
        result = worker.probe(Config(batch_size=8, accumulation_steps=8), timeout=300)
    assert result.ok, result.error_message
    assert not result.config.compile and result.compile_s and result.compile_s > 0
    assert result.start_s >= result.compile_s  # every graph (its evaluation, forward, backward) came before
    assert result.probe_accumulation == 4  # acc=8 priced from 4 micro-batches a step
