"""What several test modules share: the repository's paths, the command line in a fresh process, and
readers of what a search printed. A support module, not a test module: tests import from here, never
from one another (the fakes of CUDA, which reach into private modules, are in tests/whitebox/)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(TESTS, "scripts")
CORPUS = os.path.join(TESTS, "corpus")
REPO = os.path.dirname(TESTS)
STUDIES = os.path.join(REPO, "studies")

#: The report's sections as a reader sees them: each figure's stem (its anchor) and its heading.
REPORT_SECTIONS = (("throughput", "Throughput against batch size"), ("memory", "Peak memory against batch size"),
                   ("progress", "Search progress"), ("ranking", "Winner and runner-ups"),
                   ("memory_parts", "Where the memory goes"))


def script(name: str) -> str:
    """The path of tests/scripts/NAME."""
    return os.path.join(SCRIPTS, name)


def refused_by_the_allocator(message: str) -> bool:
    """The CPU cap's refusal as torch's allocator words it, or oneDNN (the kernels some CPUs use)."""
    return "can't allocate memory" in message or "could not create a primitive" in message


def autofit_cli(*args: str, cwd, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m autofit.cli ARGS` in a fresh process (the repo importable), its output captured."""
    return subprocess.run([sys.executable, "-m", "autofit.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": REPO, **(env or {})})


def probed_configs(search_stderr: str) -> list[tuple[str, int, int]]:
    """(status, micro-batch, accumulation) of every probe a search printed."""
    found = re.findall(r"trial \d+: (\w+)\s+\w+ b=(\d+)(?: ckpt=\d+(?: selective)?)?(?: acc=(\d+))?", search_stderr)
    return [(status, int(batch), int(accumulation or 1)) for status, batch, accumulation in found]


def probe_result(script_name: str, limit: str, batch: int, tmp_path, env: dict | None = None) -> tuple[int, dict]:
    """(exit status, result) of `autofit probe SCRIPT --batch-size BATCH` under a CPU memory limit."""
    probed = autofit_cli("probe", script(script_name), "--device", "cpu", "--memory-limit", limit, "--batch-size",
                         str(batch), "--json", cwd=tmp_path, env=env)
    assert probed.stdout, probed.stderr[-3000:]
    return probed.returncode, json.loads(probed.stdout)["result"]


