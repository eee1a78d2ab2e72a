from __future__ import annotations

import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")
REPO = os.path.dirname(HERE)
STUDIES = os.path.join(REPO, "studies")


def script(name: str) -> str:
    return os.path.join(SCRIPTS, name)


@pytest.fixture(scope="session")
def scripts_dir() -> str:
    return SCRIPTS


def refused_by_the_allocator(message: str) -> bool:
    """The CPU cap's refusal as torch's allocator words it, or oneDNN (the kernels some CPUs use)."""
    return "can't allocate memory" in message or "could not create a primitive" in message


def autofit_cli(*args: str, cwd, env: dict | None = None, timeout: int = 300):
    """`python -m autofit.cli ARGS` in a fresh process (the repo importable), its output captured."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "autofit.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": REPO, **(env or {})})


def probed_configs(search_stderr: str) -> list[tuple[str, int, int]]:
    """(status, micro-batch, accumulation) of every probe a search printed."""
    import re

    found = re.findall(r"trial \d+: (\w+)\s+\w+ b=(\d+)(?: ckpt=\d+(?: selective)?)?(?: acc=(\d+))?", search_stderr)
    return [(status, int(batch), int(accumulation or 1)) for status, batch, accumulation in found]


def probe_result(script_name: str, limit: str, batch: int, tmp_path, env: dict | None = None) -> tuple[int, dict]:
    """(exit status, result) of `autofit probe SCRIPT --batch-size BATCH` under a CPU memory limit."""
    import json

    probed = autofit_cli("probe", script(script_name), "--device", "cpu", "--memory-limit", limit, "--batch-size",
                         str(batch), "--json", cwd=tmp_path, env=env)
    assert probed.stdout, probed.stderr[-3000:]
    return probed.returncode, json.loads(probed.stdout)["result"]


@pytest.fixture(scope="session")
def postgres_base():
    """One real PostgreSQL server for the session (tests/postgres.py); each test makes its own database.
    Its folder is outside pytest's (private to root), where Debian's postgres user can reach it."""
    import shutil
    import tempfile

    from tests.postgres import postgres_server

    folder = tempfile.mkdtemp(prefix="autofit-postgres-")
    os.chmod(folder, 0o755)
    try:
        with postgres_server(folder) as url:
            yield url
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_base, request):
    """A fresh database on the session's PostgreSQL server."""
    import re

    from tests.postgres import create_database

    return create_database(postgres_base, "t_" + re.sub(r"\W", "_", request.node.name)[:50].lower())


def pytest_collection_modifyitems(config, items):
    """`gpu` tests skip where torch sees no CUDA device (torch is imported only when one is selected)."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device: torch.cuda.is_available() is False")
        for item in gpu:
            item.add_marker(skip)
