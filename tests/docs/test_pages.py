"""What the pages say that a test can hold them to: the four lines docs/guide/script.md shows for nanoGPT's
train.py are the ones the tests search and run (a newcomer copies the page, not the corpus), and the
planner's rules are numbered in order (code and pages cite them by number), and the forecast page shows what
`autofit forecast` prints."""

from __future__ import annotations

import os

from tests.support import REPO


def test_the_page_shows_the_lines_the_corpus_script_runs():
    page = open(os.path.join(REPO, "docs", "guide", "script.md"), encoding="utf-8").read()
    shown = [line[1:] for line in page.split("```diff", 1)[1].split("```", 1)[0].splitlines() if line.startswith("+")]
    script = open(os.path.join(REPO, "tests", "corpus", "nanogpt_repo", "train.py"), encoding="utf-8").read()
    added = [line for line in script.splitlines() if "# autofit:" in line]
    assert shown == added and len(added) == 4


def test_the_planners_rules_are_numbered_in_order():
    import re

    page = open(os.path.join(REPO, "docs", "reference", "planner.md"), encoding="utf-8").read()
    numbers = [int(n) for n in re.findall(r"^(\d+)\. \*\*", page, flags=re.MULTILINE)]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 10


def test_the_forecast_page_shows_what_the_command_prints():
    from click.testing import CliRunner

    from autofit.cli import cli

    page = open(os.path.join(REPO, "docs", "guide", "forecast.md"), encoding="utf-8").read()
    shown = page.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    command = shown[0].removeprefix("$ autofit ").split()
    printed = CliRunner().invoke(cli, command[:1] + [os.path.join(REPO, command[1])] + command[2:]).output
    printed = printed.replace(os.path.join(REPO, ""), "").splitlines()
    assert shown[1:-1] == printed[:-1] and printed[-1].startswith(shown[-1].removesuffix("..."))
