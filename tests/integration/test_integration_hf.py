"""The Hugging Face Trainer searched as it is (tests/scripts/hf_trainer.py: a small GPT-2 from its
config, generated tokens), for real on CPU under a real memory limit, then run with its answer."""
import json
import os
import subprocess
import sys

import pytest

from autofit.config import Config
from autofit.export import MemoryBudget
from autofit.probing import Worker
from tests.support import REPO, autofit_cli, probe_result, probed_configs, refused_by_the_allocator, script

pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
pytestmark = pytest.mark.frameworks

#: Measured on this machine (seq 128, probe peaks with the process's baseline of ~330 MiB):
#: b=4 acc=4 436 MiB, b=8 acc=2 503 MiB, b=16 624 MiB, b=16 with 4 checkpointed blocks 556 MiB.
LIMIT = "560MiB"
SCRIPT = script("hf_trainer.py")


def test_a_trainer_script_is_searched_keeps_its_global_batch_and_runs_with_the_answer(tmp_path):
    best = tmp_path / "hf.best.json"
    env = {**os.environ, "PYTHONPATH": REPO, "HF_OUT": str(tmp_path / "out")}
    searched = autofit_cli("search", script("hf_trainer.py"), "--device", "cpu", "--memory-limit", LIMIT, "--headroom", "0",
                           "--trials", "3", "--budget", "3m", "--storage", f"sqlite:///{tmp_path}/hf.db", "--out", str(best),
                           cwd=tmp_path, env={"HF_OUT": str(tmp_path / "out")})
    assert searched.returncode == 0, searched.stderr[-3000:]
    document = json.loads(best.read_text())
    config = Config.from_dict(document["config"])
    assert config.global_batch == 16  # the Trainer's own 4 x 4, held by @autofit(global_batch=16)
    probes = probed_configs(searched.stderr)
    assert probes and all(batch * accumulation == 16 for _, batch, accumulation in probes)
    assert all(status in ("ok", "oom") for status, _, _ in probes)
    # fp32 b=16 does not fit (624 MiB); on a CPU with fast bf16, bf16 b=16 may fit and win.
    assert config.precision != "fp32" or config.batch_size < 16

    ran = subprocess.run([sys.executable, script("hf_trainer.py")], env={**env, "AUTOFIT_CONFIG": str(best)},
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (f"per_device {config.batch_size} accumulation {config.accumulation_steps} "
            f"bf16 {config.precision == 'bf16'} steps 32") in ran.stdout  # 512 samples / 16 per step
    assert f"trained 32 optimizer steps with {config.label()}" in ran.stderr


def test_without_a_search_the_trainer_keeps_the_users_own_arguments(tmp_path):
    ran = subprocess.run([sys.executable, script("hf_trainer.py")],
                         env={**os.environ, "PYTHONPATH": REPO, "HF_OUT": str(tmp_path / "out")},
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "per_device 4 accumulation 4 bf16 False steps 32" in ran.stdout
    assert "trained 32 optimizer steps with fp32 b=4 acc=4" in ran.stderr


def test_a_config_that_would_change_the_global_batch_is_refused(tmp_path):
    config = tmp_path / "wrong.best.json"
    from autofit.export import BestConfig, write_best
    write_best(str(config), BestConfig(config=Config(batch_size=8), device={"type": "cpu"}))
    ran = subprocess.run([sys.executable, script("hf_trainer.py")],
                         env={**os.environ, "PYTHONPATH": REPO, "AUTOFIT_CONFIG": str(config),
                              "HF_OUT": str(tmp_path / "out")},
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode != 0
    assert "ask for a global batch of 16 (4 x 4 accumulation steps)" in ran.stderr


def test_the_frameworks_own_step_runs_out_of_memory_above_the_limit(tmp_path):
    """b=16 in one micro-batch does not fit under LIMIT: the probe's status says so (exit 1)."""
    status, result = probe_result("hf_trainer.py", LIMIT, 16, tmp_path, env={"HF_OUT": str(tmp_path / "out")})
    assert status == 1
    assert result["status"] == "oom" and refused_by_the_allocator(result["error_message"])


def test_a_model_built_at_import_loses_the_last_probes_checkpointing(monkeypatch):
    """In one process (CUDA's model), a ckpt=0 probe of a model built at import must run without the
    checkpointing the probe before it put on the blocks: it would measure too little memory."""
    monkeypatch.setenv("MODEL_AT_IMPORT", "1")
    with Worker(SCRIPT, budget=MemoryBudget(limit_bytes=3 * 2**30), probe_process="persistent") as worker:
        checkpointed = worker.probe(Config(batch_size=8, accumulation_steps=2, checkpoint_segments=2), timeout=300)
        plain = worker.probe(Config(batch_size=8, accumulation_steps=2), timeout=300)
    assert checkpointed.status == "ok", checkpointed.error_message
    assert plain.status == "ok", plain.error_message


# --- group_by_length: batched by tokens ------------------------------------------------------------
GROUPED = script("hf_group_by_length.py")


def _batches(path) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in line.split()) for line in path.read_text().splitlines()]


def test_a_trainer_that_groups_by_length_is_probed_by_tokens(tmp_path):
    """The probe's batches are the token sampler's: within its cap, the longest sample's batch first; the
    search is told the longest sample (it climbs max_tokens from there) and ranks by real tokens/s."""
    out = tmp_path / "batches.txt"
    probed = autofit_cli("probe", GROUPED, "--device", "cpu", "--max-tokens", "64", "--json", cwd=tmp_path,
                         env={"BATCHES_OUT": str(out), "HF_OUT": str(tmp_path / "out")})
    assert probed.returncode == 0, probed.stderr[-3000:]
    result = json.loads(probed.stdout)["result"]
    assert result["status"] == "ok" and result["config"]["max_tokens"] == 64
    assert result["knobs"]["longest_sample"] == 30 and result["tokens_per_s"] > 0
    batches = _batches(out)
    assert batches[0] == (2, 30) and all(samples * longest <= 64 for samples, longest in batches)


def test_a_trainer_whose_collator_pads_to_a_multiple_offers_it_and_pads_to_the_configs(tmp_path):
    """Issue 53: a collator with `pad_to_multiple_of` (HF's padding collators) offers the pad multiple; a probe
    of one pads every batch to it, and the token cap counts the padded length."""
    out = tmp_path / "batches.txt"
    probed = autofit_cli("probe", GROUPED, "--device", "cpu", "--max-tokens", "64", "--pad-multiple", "8", "--json",
                         cwd=tmp_path, env={"BATCHES_OUT": str(out), "HF_OUT": str(tmp_path / "out"),
                                            "PAD_COLLATOR": "1"})
    assert probed.returncode == 0, probed.stderr[-3000:]
    result = json.loads(probed.stdout)["result"]
    assert result["status"] == "ok" and result["knobs"]["pad_multiple"] is True
    batches = _batches(out)
    assert batches and all(longest % 8 == 0 and samples * longest <= 64 for samples, longest in batches), batches
    plain = autofit_cli("probe", GROUPED, "--device", "cpu", "--max-tokens", "64", "--json", cwd=tmp_path,
                        env={"BATCHES_OUT": str(tmp_path / "plain.txt"), "HF_OUT": str(tmp_path / "out")})
    assert not json.loads(plain.stdout)["result"]["knobs"]["pad_multiple"]  # a collator that does not pad to one


def test_a_normal_run_with_an_exported_token_cap_batches_by_tokens(tmp_path):
    from autofit.export import BestConfig, write_best

    best, out = tmp_path / "tokens.best.json", tmp_path / "batches.txt"
    write_best(str(best), BestConfig(config=Config(batch_size=64, max_tokens=64), device={"type": "cpu"}))
    ran = subprocess.run([sys.executable, GROUPED], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": REPO, "AUTOFIT_CONFIG": str(best),
                              "BATCHES_OUT": str(out), "HF_OUT": str(tmp_path / "out")})
    assert ran.returncode == 0, ran.stderr[-3000:]
    batches = _batches(out)
    assert all(samples * longest <= 64 for samples, longest in batches)
    assert sum(samples for samples, _ in batches) == 64  # one epoch, each sample once
    assert f"steps {len(batches)}" in ran.stdout  # one optimizer step per token batch


def test_with_no_searched_config_hfs_own_length_grouped_batches_stand(tmp_path):
    """No searched config (no file yet): HF's own LengthGroupedSampler and per-device batch of 4 stand."""
    out = tmp_path / "batches.txt"
    ran = subprocess.run([sys.executable, GROUPED], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": REPO, "BATCHES_OUT": str(out), "HF_OUT": str(tmp_path / "out")})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert {samples for samples, _ in _batches(out)} == {4} and "steps 16" in ran.stdout


def test_token_batches_load_as_hfs_own_training_loader_would(tmp_path):
    """Workers seeded by HF's seed_worker (per rank), prefetch, persistent workers and pinning as the
    Trainer's arguments say: a probe's loader is the loader the user's run has."""
    from transformers import TrainingArguments

    from autofit.integrations.hf import _hf_loader_arguments

    args = TrainingArguments(output_dir=str(tmp_path), dataloader_num_workers=2, dataloader_prefetch_factor=3,
                             dataloader_persistent_workers=True, use_cpu=True, report_to=[])
    loader = _hf_loader_arguments(args)
    assert loader["num_workers"] == 2 and loader["prefetch_factor"] == 3 and loader["persistent_workers"]
    seeded = loader["worker_init_fn"]
    assert seeded.func.__name__ == "seed_worker" and seeded.keywords == {"num_workers": 2, "rank": args.process_index}
    alone = _hf_loader_arguments(TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[]))
    assert alone["num_workers"] == 0 and "worker_init_fn" not in alone and "prefetch_factor" not in alone


def test_the_lengths_come_from_a_trainer_whose_sampler_takes_no_dataset(monkeypatch):
    """transformers before 4.52: `Trainer._get_train_sampler(self)`, no dataset argument."""
    from types import SimpleNamespace

    from transformers import Trainer

    from autofit.integrations.hf import AutofitTrainer

    monkeypatch.setattr(Trainer, "_get_train_sampler", lambda self: SimpleNamespace(lengths=[3, 7, 5]))
    trainer = object.__new__(AutofitTrainer)
    trainer.train_dataset = [0, 1, 2]
    assert trainer._autofit_lengths() == [3, 7, 5]


def test_a_probes_arguments_keep_the_users_logging_and_progress_bar_and_drop_evaluation_saving_and_reports(tmp_path):
    """The normal run pays for its logging (a loss read every `logging_steps`, a line printed) and its progress bar
    (updated every step) in its steps, so a probe measures them too; evaluation in the steps, saving and reports to
    TensorBoard or W&B stay out (they would stop the steps or write into the user's folders and accounts)."""
    from transformers import TrainingArguments

    from autofit.integrations.hf import arguments_for
    from autofit.runtime import Run

    users = TrainingArguments(output_dir=str(tmp_path), logging_steps=10, eval_strategy="steps", eval_steps=5,
                              save_strategy="steps", save_steps=5, report_to="none", use_cpu=True)
    probing = arguments_for(Run(Config(batch_size=8), "cpu", probing=True), users)
    assert probing.logging_strategy == "steps" and probing.logging_steps == 10 and probing.disable_tqdm is False
    assert probing.eval_strategy == "no" and probing.save_strategy == "no" and probing.report_to in ("none", [])
    assert probing.max_steps == 10**9 and probing.per_device_train_batch_size == 8
