"""A search across nodes, for real on one machine: two `autofit search --nnodes 2` processes (node 0
searches, node 1 follows) on one storage, each probe one torchrun job joined through c10d
rendezvous on a local port, one rank per node (gloo). Every probe runs on both nodes, a rank that
fails on the other node is the config's failure, and no rank is left waiting for it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import optuna
import pytest

from autofit import Config
from autofit.probing import BUDGET_CUT, free_local_port
from tests.support import REPO, autofit_cli, script


def _nodes(tmp_path, script_name: str, *extra: str, budget: str = "60s"):
    """Node 1 started first (it waits for node 0's search), then node 0; both outputs."""
    common = [script(script_name), "--nproc-per-node", "1", "--nnodes", "2",
              "--rdzv-endpoint", f"127.0.0.1:{free_local_port()}", "--memory-limit", "1GiB",
              "--storage", f"sqlite:///{tmp_path}/nodes.db", "--study", "nodes", "--precision", "fp32", *extra]
    env = {**os.environ, "PYTHONPATH": REPO, "WEIGHTS_OUT": str(tmp_path / "w.pt")}
    follower = subprocess.Popen([sys.executable, "-m", "autofit.cli", "search", *common, "--node-rank", "1"],
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        leader = autofit_cli("search", *common, "--node-rank", "0", "--budget", budget,
                             "--out", str(tmp_path / "nodes.best.json"), cwd=tmp_path, timeout=400)
        _, follower_err = follower.communicate(timeout=120)
    finally:
        follower.kill()
    return leader, follower.returncode, follower_err


def _trials(tmp_path) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name="nodes", storage=f"sqlite:///{tmp_path}/nodes.db")
    return [t for t in study.get_trials() if "probe" in t.user_attrs]


@pytest.mark.distributed
def test_every_probe_of_a_search_across_two_nodes_runs_on_both(tmp_path):
    # Bounded by its trials (a roomy budget): a neighbour on the other core slows it, and changes nothing it checks.
    leader, follower_code, follower_err = _nodes(tmp_path, "ddp_train.py", "--trials", "3", budget="5m")
    assert leader.returncode == 0, leader.stderr[-3000:]
    assert follower_code == 0, follower_err[-3000:]
    trials = _trials(tmp_path)
    # a round the budget cut (the leader's node stopped every rank at the budget's end) measured nothing
    measured = [t for t in trials if t.user_attrs["probe"].get("error_type") != BUDGET_CUT]
    assert measured and all(t.user_attrs["multinode_ranks_node1"]["ok"] for t in measured)
    assert all(t.user_attrs["probe"]["world_size"] == 2 for t in measured)
    assert f"node 1 ran {len(trials)} probes" in follower_err
    document = json.loads((tmp_path / "nodes.best.json").read_text())
    assert document["world_size"] == 2


@pytest.mark.serial  # it times the stop
@pytest.mark.distributed
def test_a_rank_failing_on_the_other_node_fails_the_config_and_stops_every_rank_in_seconds(tmp_path):
    # ddp_faults.py: rank 1 runs out of memory at batch 16 and above, is SIGKILLed at batch 12.
    leader, follower_code, follower_err = _nodes(tmp_path, "ddp_faults.py", "--batch-size", "8:24", budget="90s")
    assert leader.returncode == 0, leader.stderr[-3000:]
    assert follower_code == 0, follower_err[-3000:]
    probes = {t.number: t.user_attrs["probe"] for t in _trials(tmp_path)}
    ooms = [p for p in probes.values() if p["status"] == "oom"]
    crashed = [p for p in probes.values() if p["status"] == "crashed"]
    assert ooms and all("rank 1 of 2" in p["error_message"] for p in ooms)
    assert all(p["config"]["batch_size"] >= 16 for p in ooms)
    assert crashed and all(p["config"]["batch_size"] == 12 for p in crashed)
    # Torn down as soon as the rank failed on both nodes, not left to the probe's timeout.
    assert not [p for p in probes.values() if p["status"] == "timeout"]
    assert any(p["status"] == "ok" for p in probes.values())  # and the probes after them ran clean


def test_nodes_without_a_rendezvous_or_outside_the_count_are_refused(tmp_path):
    missing = autofit_cli("search", script("ddp_train.py"), "--nnodes", "2", "--budget", "10s", cwd=tmp_path)
    assert missing.returncode == 2 and "--nnodes needs --rdzv-endpoint HOST:PORT" in missing.stderr
    outside = autofit_cli("search", script("ddp_train.py"), "--nnodes", "2", "--node-rank", "2",
                          "--rdzv-endpoint", "127.0.0.1:29500", "--budget", "10s", cwd=tmp_path)
    assert outside.returncode == 2 and "--node-rank must be in [0, --nnodes)" in outside.stderr
    assert "Traceback" not in missing.stderr + outside.stderr


@pytest.mark.distributed
def test_one_probe_across_two_nodes(tmp_path):
    common = [script("ddp_train.py"), "--batch-size", "8", "--nproc-per-node", "1", "--nnodes", "2",
              "--rdzv-endpoint", f"127.0.0.1:{free_local_port()}", "--memory-limit", "1GiB",
              "--storage", f"sqlite:///{tmp_path}/probe.db"]
    env = {**os.environ, "PYTHONPATH": REPO, "WEIGHTS_OUT": str(tmp_path / "w.pt")}
    follower = subprocess.Popen([sys.executable, "-m", "autofit.cli", "probe", *common, "--node-rank", "1"],
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        leader = autofit_cli("probe", *common, "--node-rank", "0", "--json", cwd=tmp_path, timeout=300)
        _, follower_err = follower.communicate(timeout=120)
    finally:
        follower.kill()
    assert leader.returncode == 0, leader.stderr[-3000:]
    result = json.loads(leader.stdout)["result"]
    assert result["status"] == "ok" and result["world_size"] == 2 and result["measured_steps"] >= Config.from_dict(result["config"]).probe_steps(5)
    assert follower.returncode == 0 and "node 1 ran 1 probes" in follower_err
