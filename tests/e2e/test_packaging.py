"""What a user gets from an installed wheel and from exported files."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

from autofit.config import Config
from autofit.export import BestConfig, read_best, write_best
from autofit.search import SearchSettings, run_search
from tests.support import REPO, script


def test_best_config_files_have_ordinary_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        path = write_best(str(tmp_path / "best.json"), BestConfig(config=Config(batch_size=4)))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


@pytest.mark.slow
def test_export_keeps_the_searchs_script_hash_so_a_changed_script_warns(tmp_path):
    """The exported file carries the hash of the script the probes measured, not of the script as
    it is at export time: a script changed after the search must make the real run warn."""
    work = tmp_path / "work"
    (work / "studies").mkdir(parents=True)
    train = work / "train.py"
    shutil.copy(script("fits_small.py"), train)
    storage = f"sqlite:///{work}/studies/autofit.db"
    searched = run_search(SearchSettings(script=str(train), memory_limit=768 * 2**20, budget_s=40, trials=2,
                                         storage=storage, study="hash", out=str(work / "searched.json"),
                                         confirm_factor=2, batch_range=(1, 16)))
    with open(train, "a") as handle:
        handle.write("\nEDITED_AFTER_THE_SEARCH = True  # code, not a comment: a comment changes no version\n")
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.path.dirname(script("fits_small.py"))}
    exported = subprocess.run([sys.executable, "-m", "autofit.cli", "export", "--study", "hash", "--storage", storage,
                               "--out", str(work / "exported.json")], cwd=work, env=env, capture_output=True,
                              text=True, timeout=120)
    assert exported.returncode == 0, exported.stderr
    exported_best = read_best(str(work / "exported.json"))
    assert exported_best.script.sha256 == searched.document.script.sha256 is not None
    run = subprocess.run([sys.executable, "-c", "import train, autofit.runtime as r; "
                          "r.ProbeFinished; train.train.make_run(config_path='exported.json')"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "the training script changed since the search" in run.stderr


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """The package built as a wheel and installed into a folder of its own (torch, optuna and
    pandas come from this interpreter: only autofit's own files are under test)."""
    root = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(root / "dist"), REPO],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    wheel = next((root / "dist").glob("torch_autofit-*.whl"))
    site = root / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                                str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    return site


@pytest.mark.packaging
def test_a_wheel_ships_the_recorded_studies_and_the_commands_read_them(installed_wheel, tmp_path):
    elsewhere = tmp_path / "somewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(installed_wheel)}

    def autofit(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "autofit.cli", *args], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=180)

    where = subprocess.run([sys.executable, "-c", "import autofit; print(autofit.__file__)"], cwd=elsewhere,
                           env=env, capture_output=True, text=True, timeout=60)
    assert where.stdout.startswith(str(installed_wheel))  # the installed copy, not the checkout
    listed = autofit("studies")
    assert listed.returncode == 0 and all(f"{s}.train-cpu0" in listed.stdout for s in ("gpt", "cnn", "mlp"))
    shown = autofit("show", "--study", "gpt")
    assert shown.returncode == 0 and "best: " in shown.stdout
    reported = autofit("report", "--study", "cnn", "--out", "cnn.html")
    assert reported.returncode == 0, reported.stderr
    assert (elsewhere / "cnn.html").read_text().count("<img") == 5
