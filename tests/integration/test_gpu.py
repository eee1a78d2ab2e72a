"""The CUDA backend on a real GPU (the `gpu` tier: skipped where torch sees none)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import REPO


@pytest.mark.gpu
def test_the_cuda_backend_on_a_real_gpu():
    """scripts/check_cuda.py's checks on the real device (listing, limits, OOM, probes, NCCL), where
    the fakes above cannot reach: every check passes or says why it was skipped."""
    checked = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "check_cuda.py")], cwd=REPO,
                             capture_output=True, text=True, timeout=900)
    assert checked.returncode == 0, checked.stdout[-4000:] + checked.stderr[-3000:]
    assert "All checks passed." in checked.stdout
