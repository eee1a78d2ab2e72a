"""A GPU newcomer's commonest first mistake, end to end (issue 54): an environment whose torch is a CPU-only
build on a machine whose driver sees a GPU. NVML is faked by a `pynvml` module first on the path (one H100);
torch is this machine's, a CPU-only build. `autofit devices` fails with the one-line fix, and a normal run
trains on the CPU saying so, with the same fix, in its first line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.support import REPO

FAKE_NVML = '''
from types import SimpleNamespace
class NVMLError(Exception): pass
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetName(h): return "NVIDIA H100 80GB HBM3"
def nvmlDeviceGetMemoryInfo(h): return SimpleNamespace(total=85520809984, free=85000000000, used=520809984)
'''

TRAIN = '''
import torch
from autofit import autofit

@autofit(global_batch=8)
def train(run):
    model = torch.nn.Linear(4, 1).to(run.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    for x, y in run.batches(torch.utils.data.DataLoader(data, batch_size=run.batch_size)):
        with run.autocast():
            loss = torch.nn.functional.mse_loss(model(x), y)
        run.backward(loss, opt)

if __name__ == "__main__":
    train()
'''

pytestmark = pytest.mark.skipif(torch.version.cuda is not None, reason="stands for a CPU-only torch")


def _run(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    (tmp_path / "fake").mkdir(exist_ok=True)
    (tmp_path / "fake" / "pynvml.py").write_text(FAKE_NVML)
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOFIT_DEVICE", "AUTOFIT_CONFIG", "CUDA_VISIBLE_DEVICES")}
    return subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**env, "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), REPO])})


def test_devices_fails_with_the_fix_where_nvml_sees_a_gpu_that_torch_cannot_use(tmp_path):
    done = _run(["-m", "autofit.cli", "devices"], tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "cuda:0  NVIDIA H100 80GB HBM3  79.65 GiB total" in done.stdout  # NVML's view
    assert f"torch {torch.__version__}: a CPU-only build (no CUDA)" in done.stdout  # torch's, beside it
    fix = done.stderr.strip()
    assert "\n" not in fix and fix.startswith(f"autofit: error: torch {torch.__version__} is a CPU-only build")
    assert "https://pytorch.org/get-started/locally/" in fix


def test_a_normal_run_says_in_its_first_line_that_it_trains_on_the_cpu_and_why(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    done = _run(["train.py"], tmp_path)
    assert done.returncode == 0, done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith(f"autofit: on cpu (torch {torch.__version__} is a CPU-only build, so it cannot use the "
                            f"NVIDIA H100 80GB HBM3 NVML sees: install PyTorch's CUDA build"), first
    assert "https://pytorch.org/get-started/locally/" in first and "running with defaults" in first
