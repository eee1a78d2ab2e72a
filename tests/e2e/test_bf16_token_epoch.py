"""A whole epoch by tokens in bf16 on a CPU that runs bf16 natively, under the memory limit its search used (issue
53: a 2 GiB, 4-minute search exported bf16 max_tokens=3072, whose epoch held 1.38 GiB between steps by step 40,
ran out of memory, and its redo blamed a variable of the loop). oneDNN keeps a primitive, and PyTorch's mkldnn
layer an entry, for each shape a bf16 matmul meets; a length-sorted epoch meets a new shape at almost every
batch, a probe a few. Before the fix the same run of tests/corpus/varlen_lm.py ran out of memory at step 38 of
its epoch (bf16 max_tokens=4096, 2 GiB: "the run holds 1.84 GiB between steps")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from autofit.devices import cpu_has_native_bf16
from autofit.runtime import lowered_path
from tests.support import CORPUS

LIMIT = "2GiB"


@pytest.mark.slow
@pytest.mark.skipif(not cpu_has_native_bf16(), reason="bf16 is emulated on this CPU (no AVX512-BF16 or AMX)")
def test_a_bf16_token_configs_whole_epoch_runs_under_its_searchs_limit_without_running_out(tmp_path):
    """The token range keeps the caps to those of the issue's pick (3072, 4096: 50 steps or more an epoch); two
    probes; then the exported file's whole epoch as a normal run under the searched limit ($AUTOFIT_MEMORY_LIMIT
    =json): it finishes, lowers nothing, and its file records the per-shape caches its probes ran under."""
    path = os.path.join(CORPUS, "varlen_lm.py")
    # The thread count sets the CPU's buffers: the same in both. One thread, a pool worker's share of CI's two
    # cores (two threads beside another test took 197 s, one 90 s alone); with the libraries' own cache sizes the
    # epoch still runs out, at step 44 of 56 (two threads: step 37).
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    searched = subprocess.run([sys.executable, "-m", "autofit.cli", "search", path, "--device", "cpu", "--precision",
                               "bf16", "--memory-limit", LIMIT, "--token-range", "3072:4096", "--trials", "2",
                               "--budget", "10m"], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    assert searched.returncode == 0, searched.stderr[-3000:]
    best = tmp_path / "studies" / "varlen_lm.train.cpu.best.json"
    document = json.loads(best.read_text())
    assert document["config"]["precision"] == "bf16" and document["config"]["max_tokens"] <= 4096
    assert document["measured"]["token_envelope"]["caches"]  # the bounds its probes ran under
    ran = subprocess.run([sys.executable, path], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                         env={**env, "AUTOFIT_CONFIG": str(best), "AUTOFIT_MEMORY_LIMIT": "json"})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "varlen_lm: done" in ran.stdout and "out of memory" not in ran.stderr, ran.stderr[-3000:]
    assert not os.path.exists(lowered_path(str(best)))
