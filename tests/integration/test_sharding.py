"""Sharding as a searched knob: a distributed train function that offers its blocks to
`run.distribute(model, blocks=...)` has DDP and FSDP2 searched like precision. The planner keeps
their memory apart (sharding splits the weights, not the activations) and bounds a sharded strategy
by its DDP twin; on CPU (gloo, 2 ranks) a search probes both, exports the sharding, and a torchrun
run with that file shards the model."""
from __future__ import annotations

import json

import pytest
import torch

from autofit.config import MAX_BATCH, Config
from autofit.planner import Observation, Planner, SearchSpace
from autofit.probing import free_local_port
from tests.support import autofit_cli, script
from tests.support.runs import config_file, run_ddp_train

GiB, MiB = 2**30, 2**20
USABLE = 2 * GiB


def _landscape(fsdp_speed: float):
    """DDP holds 1.5 GiB of weights and optimizer state on each rank, FSDP2 a third of it; both add
    8 MiB per sample. FSDP2 runs `fsdp_speed` x DDP's throughput at the same batch."""
    def probe(config: Config) -> Observation:
        fixed = 1.5 * GiB if config.sharding == "ddp" else 0.5 * GiB
        peak = fixed + config.batch_size * 8 * MiB
        if peak > USABLE * 1.05:
            return Observation(config, "oom")
        rate = 1000.0 * config.batch_size / (config.batch_size + 32)
        return Observation(config, "ok", peak_bytes=int(peak),
                           rate=rate * (fsdp_speed if config.sharding != "ddp" else 1.0))
    return probe


def _search(fsdp_speed: float) -> tuple[Planner, list[Observation]]:
    space = SearchSpace.build(batch_range=(1, MAX_BATCH), precision=("fp32",), sharding=("ddp", "fsdp"))
    planner = Planner(space, USABLE, check_noise=False)
    probe, seen = _landscape(fsdp_speed), []
    for _ in range(60):
        config = planner.next(seen)
        if config is None:
            break
        assert config not in {o.config for o in seen}
        seen.append(probe(config))
    return planner, seen


def test_sharding_that_fits_a_larger_batch_wins_and_ddps_limit_does_not_bound_it():
    planner, seen = _search(fsdp_speed=0.9)
    ddp_fit = max(o.config.batch_size for o in seen if o.status == "ok" and o.config.sharding == "ddp")
    assert any(o.status == "ok" and o.config.sharding == "fsdp" and o.config.batch_size > ddp_fit for o in seen)
    best = planner.best(seen)
    assert best.sharding == "fsdp" and best.batch_size > 64  # DDP fits 64 at most


def test_a_sharding_slower_everywhere_gets_few_probes_and_ddp_wins():
    planner, seen = _search(fsdp_speed=0.3)
    assert planner.best(seen).sharding == "ddp"
    assert sum(o.config.sharding == "fsdp" for o in seen) <= 2  # bounded by its DDP twin once measured


def test_a_sharding_that_fails_without_running_is_dropped_after_one_failure():
    space = SearchSpace.build(batch_range=(1, MAX_BATCH), precision=("fp32",), sharding=("ddp", "fsdp"))
    planner = Planner(space, USABLE, check_noise=False)
    seen = [Observation(Config(batch_size=4), "ok", peak_bytes=GiB + 4 * MiB, rate=4.0),
            Observation(Config(batch_size=16, sharding="fsdp"), "error")]
    proposed = 0
    for _ in range(20):
        config = planner.next(seen)
        if config is None:
            break
        assert config.sharding == "ddp"
        proposed += 1
        seen.append(Observation(config, "ok", peak_bytes=GiB + config.batch_size * MiB, rate=float(config.batch_size)))
    assert proposed >= 5  # the planner went on with DDP, and never came back to fsdp


def test_configs_keep_their_form_unless_sharded():
    assert "sharding" not in Config(batch_size=8).to_dict()
    assert Config.from_dict(Config(batch_size=8, sharding="fsdp").to_dict()) == Config(batch_size=8, sharding="fsdp")
    assert Config(batch_size=8, precision="bf16", sharding="fsdp").label() == "bf16 b=8 fsdp"


def test_sharding_is_refused_where_it_cannot_apply(tmp_path):
    alone = autofit_cli("search", script("ddp_train.py"), "--sharding", "fsdp", "--budget", "10s", cwd=tmp_path)
    assert alone.returncode == 2 and "--sharding is for distributed probes" in alone.stderr
    offload = autofit_cli("search", script("ddp_train.py"), "--nproc-per-node", "2", "--sharding", "fsdp-offload",
                          "--budget", "10s", cwd=tmp_path)
    assert offload.returncode == 2 and "on the CPU there is nothing to offload to" in offload.stderr
    assert "Traceback" not in alone.stderr + offload.stderr


@pytest.mark.distributed
def test_a_search_on_two_ranks_tries_fsdp_and_a_torchrun_run_applies_the_exported_sharding(tmp_path):
    # Sharding only adds communication where everything fits, so a search with DDP beside it may prune
    # FSDP unprobed (its bound is DDP's curve): asked for FSDP, the search must probe it.
    searched = autofit_cli("search", script("ddp_train.py"), "--nproc-per-node", "2", "--memory-limit", "1GiB",
                           "--precision", "fp32", "--sharding", "fsdp", "--trials", "4", "--budget", "3m",
                           "--storage", f"sqlite:///{tmp_path}/s.db", "--out", str(tmp_path / "s.best.json"),
                           cwd=tmp_path, env={"BLOCKS": "1", "WEIGHTS_OUT": str(tmp_path / "w.pt")})
    assert searched.returncode == 0, searched.stderr[-3000:]
    assert " fsdp " in searched.stderr  # a probe of the sharded strategy
    document = json.loads((tmp_path / "s.best.json").read_text())
    assert document["config"]["sharding"] in ("ddp", "fsdp") and document["world_size"] == 2

    # Whatever won, the exported sharding is what a torchrun run applies: FSDP2 through blocks=.
    best = config_file(tmp_path / "f.best.json", Config(batch_size=8, accumulation_steps=4, sharding="fsdp"))
    sharded = run_ddp_train(tmp_path, "sharded", 2, AUTOFIT_CONFIG=best, BLOCKS="1")
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert "each fp32 b=8 acc=2 fsdp" in sharded.stderr
    single = run_ddp_train(tmp_path, "single", None, AUTOFIT_CONFIG=best, BLOCKS="1")
    assert single.returncode == 0, single.stderr[-3000:]
    a, b = torch.load(tmp_path / "sharded.pt"), torch.load(tmp_path / "single.pt")
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)


@pytest.mark.distributed
def test_the_bundled_gpt_probes_under_fsdp2_with_checkpointing_and_a_torchrun_run_trains_so(tmp_path):
    """studies/gpt.py offers its blocks: an FSDP2 probe with checkpointed blocks runs on 2 ranks, and
    `torchrun --nproc-per-node 2 studies/gpt.py` trains with a file that says so. (That a search on two
    ranks exports what a torchrun run picks up is test_distributed's and the ddp_converted corpus entry's.)"""
    import os
    import subprocess
    import sys

    from tests.support import REPO, STUDIES

    probed = autofit_cli("probe", os.path.join(STUDIES, "gpt.py"), "--nproc-per-node", "2", "--batch-size", "8",
                         "--checkpoint-segments", "2", "--sharding", "fsdp", "--memory-limit", "1GiB", "--json", cwd=tmp_path)
    assert probed.returncode == 0, probed.stderr[-3000:]
    result = json.loads(probed.stdout)["result"]
    assert result["status"] == "ok" and result["world_size"] == 2 and result["knobs"]["shard_blocks"] == 4

    config = Config(batch_size=64, checkpoint_segments=2, sharding="fsdp")  # the epoch in 4x fewer steps than at 16
    best = config_file(tmp_path / "g.best.json", config)
    ran = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                          f"--master-port={free_local_port()}", "--master-addr=127.0.0.1", os.path.join(STUDIES, "gpt.py")],
                         env={**os.environ, "PYTHONPATH": REPO, "AUTOFIT_CONFIG": best},
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert f"2 ranks, each {config.label()}" in ran.stderr
    assert ran.stdout.count("gpt: epoch 1, loss") == 1  # the main rank reports, once
