"""A script without a function (`autofit.start`), from the command line: searched with its own arguments
after `--` (recorded in the study and the best-config file), then run normally with the config found;
run normally before any search, with the declared defaults; a second `autofit.start` is an error."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import optuna
import pytest

from autofit.config import Config
from autofit.probing import calls_start, free_local_port
from autofit.study import trial_result
from tests.support import REPO, autofit_cli, script
from tests.support.runs import config_file


def _python(path, *args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, path, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": REPO})


def test_calls_start_reads_the_source(tmp_path):
    assert calls_start(script("starts.py"))
    assert not calls_start(script("fits_small.py"))
    aliased = tmp_path / "aliased.py"
    aliased.write_text("from autofit import start as begin\nrun = begin(global_batch=8)\n")
    assert calls_start(str(aliased))


@pytest.mark.slow  # a real probe or estimate of 7-9 s: the default tier stays under 5 minutes
def test_a_normal_run_before_any_search_trains_the_declared_defaults(tmp_path):
    shutil.copy(script("starts.py"), tmp_path / "starts.py")
    done = _python("starts.py", "--iters=20", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "autofit: on cpu (no GPU is visible), no best config found for starts.py" in done.stderr
    assert "running with defaults: fp32 b=32" in done.stderr
    assert "autofit: trained 20 optimizer steps with fp32 b=32" in done.stderr
    assert "done after 20 steps" in done.stdout


def test_a_second_start_in_a_normal_run_is_a_clear_error(tmp_path):
    shutil.copy(script("starts.py"), tmp_path / "starts.py")
    done = _python("starts.py", "--twice", "--iters=2", cwd=tmp_path)
    assert done.returncode != 0
    assert "A script must call autofit.start once, but it called it a second time" in done.stderr


@pytest.mark.slow
def test_a_start_script_searched_with_its_arguments_then_run_normally(tmp_path):
    """Its arguments reach every probe as given, and are recorded with the secret's value hidden."""
    shutil.copy(script("starts.py"), tmp_path / "starts.py")
    record = tmp_path / "record.jsonl"
    secret = "s3cret-9f8e7d"
    given = [f"--record={record}", "--iters=400", "--wandb-api-key", secret]
    searched = autofit_cli("search", "starts.py", "--trials", "3", "--batch-range", "1:64", "--memory-limit", "2GiB",
                           "--json", "--", *given, cwd=tmp_path, timeout=600)
    assert searched.returncode == 0, searched.stderr
    document = json.loads(searched.stdout)["best"]
    assert document["script"]["args"] == [f"--record={record}", "--iters=400", "--wandb-api-key", "***"]
    seen = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(seen) >= 3 and all(r["argv"] == given for r in seen)  # every probe, the secret as given
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".db", ".json")]
    assert written and not [p for p in written if secret.encode() in p.read_bytes()]  # the study, the file
    assert secret not in searched.stdout + searched.stderr
    best = document["config"]["batch_size"]
    resumed = autofit_cli("search", "starts.py", "--trials", "3", "--batch-range", "1:64", "--memory-limit", "2GiB",
                          "--", "--iters=400", cwd=tmp_path, timeout=600)
    assert resumed.returncode == 2  # its probes measured the script under other arguments
    assert "must be resumed with the same script arguments (after --:" in resumed.stderr
    same = _python("starts.py", *given, cwd=tmp_path)
    assert same.returncode == 0 and "not those searched" not in same.stderr
    other = _python("starts.py", "--iters=20", cwd=tmp_path)
    assert other.returncode == 0, other.stderr
    assert "running starts.py with the best config from" in other.stderr
    assert (f"this run's arguments (--iters=20) are not those searched "
            f"(--record={record} --iters=400 --wandb-api-key ***)") in other.stderr
    assert f"autofit: trained 20 optimizer steps with fp32 b={best}" in other.stderr


@pytest.mark.slow  # 11 s each: the default tier keeps under 5 minutes (its start scripts probe elsewhere)
@pytest.mark.parametrize("command", [["probe", "starts.py", "--batch-size", "4"], ["estimate", "starts.py"]])
def test_probe_and_estimate_hand_the_script_its_arguments(tmp_path, command):
    shutil.copy(script("starts.py"), tmp_path / "starts.py")
    record = tmp_path / "record.jsonl"
    done = autofit_cli(*command, "--", f"--record={record}", "--iters=100000", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    seen = [json.loads(line) for line in record.read_text().splitlines()]
    assert seen and all(r["argv"] == [f"--record={record}", "--iters=100000"] for r in seen)


@pytest.mark.distributed
def test_a_torchrun_script_that_starts_its_own_ddp_is_searched_on_two_ranks_then_run_under_torchrun(tmp_path):
    """nanoGPT's shape: `autofit.start`, then the script's own `init_process_group` (gloo) and DDP wrapper, its
    accumulation shared out over the ranks. Every probe is a 2-rank torchrun job whose ranks agree on the
    config; torchrun then runs the script with the config found, the global batch kept."""
    shutil.copy(script("starts_ddp.py"), tmp_path / "starts_ddp.py")
    record = tmp_path / "record.jsonl"
    searched = autofit_cli("search", "starts_ddp.py", "--nproc-per-node", "2", "--trials", "3", "--memory-limit", "2GiB",
                           "--json", "--", f"--record={record}", cwd=tmp_path, timeout=900)
    assert searched.returncode == 0, searched.stderr[-3000:]
    document = json.loads(searched.stdout)["best"]
    assert document["world_size"] == 2
    seen = [json.loads(line) for line in record.read_text().splitlines()]
    by_rank = {rank: [(r["batch_size"], r["accumulation"]) for r in seen if r["rank"] == rank] for rank in (0, 1)}
    assert len(by_rank[0]) >= 3 and by_rank[0] == by_rank[1]  # both ranks of every probe ran one config
    assert all(b * acc * 2 == 32 for b, acc in by_rank[0])  # the script's global batch, 8 x 4, kept on 2 ranks
    config = document["config"]
    record.unlink()
    ran = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                          f"--master-port={free_local_port()}", "--master-addr=127.0.0.1", "starts_ddp.py", "--iters=10",
                          f"--record={record}"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": REPO, "AUTOFIT_DEVICE": "cpu"})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "done after 10 iterations on 2 ranks" in ran.stdout
    ranks = [json.loads(line) for line in record.read_text().splitlines()]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert {(r["batch_size"], r["accumulation"]) for r in ranks} == {(config["batch_size"], config["accumulation_steps"])}


@pytest.mark.slow
def test_a_loop_that_reads_no_batch_knob_is_not_climbed_and_says_so(tmp_path):
    """own_batch_loop.py trains 16 samples a step whatever the config says: one micro-batch is probed (the
    search does not climb a knob the loop never reads), and the search says why."""
    from autofit.search import SearchSettings, run_search

    result = run_search(SearchSettings(script=script("own_batch_loop.py"), memory_limit=2**30, trials=4,
                                       budget_s=300, storage=f"sqlite:///{tmp_path}/o.db", out=str(tmp_path / "o.json"),
                                       confirm_factor=2))
    study = optuna.load_study(study_name=result.study_name, storage=f"sqlite:///{tmp_path}/o.db")
    sizes = {trial_result(t).config.batch_size for t in study.trials if trial_result(t)}
    assert len(sizes) == 1, sizes
    assert any("reads neither run.batch_size nor run.global_batch" in note for note in result.notes)


def _starts_with_best_batch(tmp_path, batch_size: int) -> None:
    """starts.py beside a best-config file of `batch_size` (each sample holds 2 MiB of activations)."""
    shutil.copy(script("starts.py"), tmp_path / "starts.py")
    config_file(tmp_path / "starts.best.json", Config(batch_size=batch_size))


@pytest.mark.slow  # two or three real executions of the script, a few seconds each
def test_a_start_script_that_runs_out_of_memory_early_runs_again_at_a_lower_micro_batch(tmp_path):
    """Issue 45, item 6: a module-level script has no step autofit can redo, so an OOM that reaches the top
    early in training runs the whole script again, halving the micro-batch with the global batch kept, in one
    line each time, until it fits; the change is recorded beside the config file it started from."""
    _starts_with_best_batch(tmp_path, 1024)
    record = tmp_path / "seen.jsonl"
    done = subprocess.run([sys.executable, "starts.py", "--iters=3", f"--record={record}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": REPO, "AUTOFIT_CONFIG": "starts.best.json",
                               "AUTOFIT_MEMORY_LIMIT": "1GiB"})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = [json.loads(line)["batch_size"] for line in record.read_text().splitlines()]
    assert seen[0] == 1024 and len(seen) >= 2, seen  # ran from its top again, each time smaller
    assert all(b == a // 2 for a, b in zip(seen, seen[1:])), seen
    assert done.stderr.count("runs again from its top") == len(seen) - 1, done.stderr[-3000:]
    # one line per restart (issue 54): the config file's line once, then only "started again", on the device
    assert done.stderr.count("with the best config from") == 1, done.stderr[-3000:]
    assert done.stderr.count("autofit: on cpu, started again after an out-of-memory") == len(seen) - 1
    assert f"with fp32 b={seen[1]} acc=2 (global batch 1024 unchanged)" in done.stderr
    assert f"autofit: trained 3 optimizer steps with fp32 b={seen[-1]} acc={1024 // seen[-1]}" in done.stderr
    lowered = json.loads((tmp_path / "starts.lowered.json").read_text())
    assert lowered["started_with"]["batch_size"] == 1024 and lowered["ended_with"]["batch_size"] == seen[-1]
    assert [change["after"]["batch_size"] for change in lowered["lowerings"]] == seen[1:]  # every restart kept


@pytest.mark.slow
def test_a_start_script_with_the_fallback_turned_off_stops_at_its_oom(tmp_path):
    _starts_with_best_batch(tmp_path, 1024)
    done = subprocess.run([sys.executable, "starts.py", "--iters=3"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": REPO, "AUTOFIT_CONFIG": "starts.best.json",
                                            "AUTOFIT_MEMORY_LIMIT": "1GiB", "AUTOFIT_OOM_RECOVERY": "0"})
    assert done.returncode != 0 and "runs again from its top" not in done.stderr
    assert not (tmp_path / "starts.lowered.json").exists()


@pytest.mark.slow  # one real probe, a few seconds
def test_a_start_script_offers_its_blocks_to_checkpointing(tmp_path):
    """docs/guide/script.md's example: a module-level script that calls run.checkpoint(blocks) after
    autofit.start offers the knob, and a probe checkpoints as many blocks as its config says."""
    done = autofit_cli("probe", script("starts_blocks.py"), "--device", "cpu", "--batch-size", "8",
                       "--checkpoint-segments", "8", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "checkpoint (8 blocks)" in done.stdout
