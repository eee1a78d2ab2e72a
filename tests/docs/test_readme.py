"""What the README shows runs and is what was printed (issue 54, item 5): the script its diff ends with trains
as a normal run on the CPU (the diff once used an undefined `GPT(cfg)` and `data`), the script it starts from
is valid Python, and its sample output is the named log's lines as they were printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.support import REPO

README = os.path.join(REPO, "README.md")


def _diff() -> list[str]:
    return open(README, encoding="utf-8").read().split("```diff\n", 1)[1].split("```", 1)[0].splitlines()


def _side(keep: str) -> str:
    """The script before (`keep` "-") or after ("+") the diff."""
    return "\n".join(line[1:] for line in _diff() if line[:1] in (" ", keep) or not line) + "\n"


def test_the_script_the_diff_ends_with_trains_on_the_cpu(tmp_path):
    compile(_side("-"), "before.py", "exec")  # the script it starts from is Python too
    (tmp_path / "train.py").write_text(_side("+"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOFIT_")}
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**env, "PYTHONPATH": REPO, "AUTOFIT_DEVICE": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "running with defaults: fp32 b=32 acc=8 (global batch 256 as declared" in done.stderr
    assert re.search(r"autofit: trained 32 optimizer steps with fp32 b=32 acc=8: [\d,.]+ samples/s", done.stderr)


def test_the_sample_output_is_the_logs_as_printed():
    text = open(README, encoding="utf-8").read()
    log = re.search(r"\(as the log has it,\s+`(benchmarks/gpu/results/[\w.-]+)`", text).group(1)
    shown = text.split(log, 1)[1].split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    printed = open(os.path.join(REPO, log), encoding="utf-8").read().splitlines()
    assert len(shown) > 10 and all(line in printed for line in shown), [line for line in shown if line not in printed]
    first, last = printed.index(shown[0]), printed.index(shown[-1])
    assert printed[first:last + 1] == shown  # the whole search, in order, nothing left out


def test_the_first_gpu_commands_study_names_no_device():
    """`autofit search studies/gpt.py --budget 3m` is the README's first GPU command: the study must train
    where the run says (its model through run.distribute, its batches through run.batches), with no device
    of its own in its source (no GPU here to run it on)."""
    source = open(os.path.join(REPO, "studies", "gpt.py"), encoding="utf-8").read()
    code = "\n".join(line.split("#")[0] for line in source.split('"""', 2)[2].splitlines())  # past the docstring
    assert not re.search(r"""["'](cpu|cuda)(:\d)?["']|\.cuda\(|\.cpu\(""", code)
    assert "run.distribute(model" in code and "run.batches(loader" in code
    assert "autofit search studies/gpt.py --budget 3m" in open(README, encoding="utf-8").read()
