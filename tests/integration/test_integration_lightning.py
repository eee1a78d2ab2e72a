"""A Lightning script searched as it is (tests/scripts/lightning_module.py), for real on CPU under a
real memory limit, then run with its answer."""
import json
import os
import subprocess
import sys

import pytest

from autofit.config import Config
from tests.support import REPO, autofit_cli, probe_result, probed_configs, refused_by_the_allocator, script

pytest.importorskip("lightning", reason="the lightning extra: pip install -e '.[lightning]'")

#: Probe peaks on one intra-op thread, which these tests pin (each thread adds its own buffers: on two, b=64 peaks
#: at 795 MiB), measured 2026-12-05 with the process's baseline: b=16 acc=4 579 MiB, b=32 acc=2 640 MiB, b=64 with 4
#: checkpointed blocks 708 MiB, b=64 763 MiB. The limit sits between b=32 and the two b=64s (at 760 MiB, b=64 on
#: one thread fitted now and then once a probe kept the Trainer's model summary).
LIMIT = "680MiB"
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def _run(tmp_path, config_path=None):
    env = {**os.environ, "PYTHONPATH": REPO, "PL_OUT": str(tmp_path / "out")}
    if config_path:
        env["AUTOFIT_CONFIG"] = str(config_path)
    return subprocess.run([sys.executable, script("lightning_module.py")], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)


@pytest.mark.frameworks
def test_a_lightning_script_is_searched_keeps_its_global_batch_and_runs_with_the_answer(tmp_path):
    best = tmp_path / "pl.best.json"
    searched = autofit_cli("search", script("lightning_module.py"), "--device", "cpu", "--memory-limit", LIMIT, "--headroom", "0",
                           "--trials", "3", "--budget", "3m", "--storage", f"sqlite:///{tmp_path}/pl.db", "--out", str(best),
                           cwd=tmp_path, env={"PL_OUT": str(tmp_path / "out"), **ONE_THREAD})
    assert searched.returncode == 0, searched.stderr[-3000:]
    config = Config.from_dict(json.loads(best.read_text())["config"])
    assert config.global_batch == 64
    probes = probed_configs(searched.stderr)
    assert probes and all(batch * accumulation == 64 for _, batch, accumulation in probes)
    assert all(status in ("ok", "oom") for status, _, _ in probes)
    # fp32 b=64 does not fit (763 MiB, 708 checkpointed); on a CPU with fast bf16, bf16 b=64 may fit and win.
    assert config.precision != "fp32" or config.batch_size < 64

    ran = _run(tmp_path, best)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (f"accumulation {config.accumulation_steps} micro-batch {config.batch_size} steps 16") in ran.stdout
    assert f"trained 16 optimizer steps with {config.label()}" in ran.stderr


@pytest.mark.frameworks
def test_without_a_search_the_trainer_keeps_the_users_own_settings(tmp_path):
    ran = _run(tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "precision 32-true accumulation 4 micro-batch 16 steps 16" in ran.stdout
    assert "trained 16 optimizer steps with fp32 b=16 acc=4" in ran.stderr


def test_before_a_search_a_trainer_that_changes_the_declared_global_batch_says_so(capsys):
    """@autofit(global_batch=32) gives a micro-batch of 32 before any search; a Trainer that accumulates 2
    of them trains 64. The loader was built first, so autofit cannot keep both: it says what trains and how
    to train the declared batch."""
    from autofit.integrations.lightning import trainer_settings
    from autofit.runtime import Run

    run = Run(Config(batch_size=32), "cpu", defaults=True)  # the decorator's default for global_batch=32
    settings = trainer_settings(run, {"accumulate_grad_batches": 2})
    assert settings["accumulate_grad_batches"] == 2 and run.config.global_batch == 64
    said = capsys.readouterr().err
    assert "global batch is 64, not the 32 @autofit declares" in said and "default_batch_size=16" in said
    kept = Run(Config(batch_size=16, accumulation_steps=2), "cpu", defaults=True)  # default_batch_size=16
    trainer_settings(kept, {"accumulate_grad_batches": 2})
    assert kept.config.global_batch == 32 and "declares" not in capsys.readouterr().err


@pytest.mark.parametrize("precision, lightning_precision", [("fp32", "32-true"), ("bf16", "bf16-mixed"),
                                                           ("fp16", "16-mixed")])
def test_the_config_becomes_the_trainers_settings(precision, lightning_precision):
    """(bf16 is emulated on CPUs without bf16 instructions, ~15x slower: checked on the settings.)"""
    from autofit.integrations.lightning import trainer_settings
    from autofit.runtime import Run

    settings = trainer_settings(Run(Config(batch_size=32, precision=precision, accumulation_steps=2), "cpu"), {"max_epochs": 3})
    assert settings["precision"] == lightning_precision and settings["accumulate_grad_batches"] == 2
    assert settings["max_epochs"] == 3 and settings["accelerator"] == "cpu"
    probing = trainer_settings(Run(Config(batch_size=32), "cpu", probing=True), {"max_epochs": 3})
    assert probing["max_epochs"] == -1 and probing["check_val_every_n_epoch"] is None and probing["logger"] is False
    assert "num_sanity_val_steps" not in probing and "limit_val_batches" not in probing  # the user's sanity check
    # ... and the user's progress bar and model summary: the bar's update is part of each of the run's steps.
    assert "enable_progress_bar" not in probing and "enable_model_summary" not in probing
    kept = trainer_settings(Run(Config(batch_size=32), "cpu", probing=True), {"enable_progress_bar": False})
    assert kept["enable_progress_bar"] is False


@pytest.mark.frameworks
@pytest.mark.parametrize("process", ["fork", "persistent"])
def test_a_probe_runs_the_users_sanity_check_as_the_normal_run_does_and_never_validates_in_its_steps(tmp_path, process):
    """What a run does before its steps sets glibc's dynamic mmap threshold, and with it how often the steps fault
    pages in: a tied LM's probe without its sanity check read 0.96 of its normal run (benchmarks.fidelity). So a
    probe runs the Trainer's sanity check (2 validation batches, Lightning's default) as the normal run does, and
    then no validation at all, though its steps cross several epochs' ends (8 micro-batches each)."""
    events = tmp_path / "events"
    env = {"EVENTS_OUT": str(events), "PL_OUT": str(tmp_path / "out")}
    probed = autofit_cli("probe", script("lightning_validates.py"), "--device", "cpu", "--batch-size", "8",
                         "--probe-process", process, "--json", cwd=tmp_path, env=env)
    assert probed.returncode == 0, probed.stderr[-3000:]
    probe = events.read_text().split()
    assert probe[:2] == ["validation", "validation"] and probe[2] == "train"
    assert "validation" not in probe[2:] and probe.count("train") > 2 * 8

    events.unlink()
    ran = subprocess.run([sys.executable, script("lightning_validates.py")], env={**os.environ, **env, "PYTHONPATH": REPO},
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert events.read_text().split() == ["validation"] * 2 + ["train"] * 8 + ["validation"] * 4


@pytest.mark.frameworks
def test_the_frameworks_own_step_runs_out_of_memory_above_the_limit(tmp_path):
    """b=64 in one micro-batch does not fit under LIMIT: the probe's status says so (exit 1)."""
    status, result = probe_result("lightning_module.py", LIMIT, 64, tmp_path,
                                  env={"PL_OUT": str(tmp_path / "out"), **ONE_THREAD})
    assert status == 1
    assert result["status"] == "oom" and refused_by_the_allocator(result["error_message"])


@pytest.mark.frameworks
def test_a_trainer_at_lightnings_defaults_probes_twice_in_one_process_and_leaves_no_thread_behind(tmp_path, monkeypatch):
    """CUDA's process model on the CPU, with the progress bar (Rich's, whose refresh is a thread), the model summary
    and the sanity check a probe now keeps: each probe ends by an exception inside the Trainer's step, and the bar's
    thread stops with it (Lightning's on_exception), so the second probe starts with the threads the first did."""
    from autofit.probing import Worker

    monkeypatch.setenv("PL_OUT", str(tmp_path / "out"))
    monkeypatch.chdir(tmp_path)
    with Worker(script("lightning_defaults.py"), probe_process="persistent") as worker:
        worker.start()
        threads = []
        for batch in (16, 8):
            result = worker.probe(Config(batch_size=batch), timeout=300)
            assert result.status == "ok", (result.error_message, result.traceback)
            threads.append(len(os.listdir(f"/proc/{worker.pid}/task")))
    assert threads[0] == threads[1], threads
