"""Every default `--help` states is the code's, and docs/reference/cli.md shows no other (issue 45, item 4):
a click default shown in the help and a default stated in words ("(default: full,selective)") agree with
the value the page's synopsis gives the same option; the device's default is what the code does."""

from __future__ import annotations

import os
import re

import click
import pytest

from autofit.cli import cli
from tests.support import REPO

PAGE = os.path.join(REPO, "docs", "reference", "cli.md")
COMMANDS = ("search", "probe", "estimate")


def _synopsis_values(command: str) -> dict[str, str]:
    """`--flag VALUE` pairs of one command's synopsis lines, the VALUE an example or a default."""
    block = open(PAGE, encoding="utf-8").read().split("```", 2)[1]
    text, current = "", None
    for line in block.splitlines():
        found = re.match(r"autofit (\w+)", line)
        current = found.group(1) if found else current
        if current == command:
            text += " " + line
    return dict(re.findall(r"(--[a-z][a-z0-9-]*) ([^\s\[\]|-][^\s\[\]|]*)", text))


def _stated_defaults(command: click.Command) -> dict[str, str]:
    """What each option's help says its default is: click's shown default, or '(default: X)' of one word."""
    stated = {}
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden or param.is_flag:
            continue
        flag = next(o for o in param.opts if o.startswith("--"))
        worded = re.search(r"\(default: ([^\s);]+)\)", param.help or "")
        if param.show_default and param.default is not None and not isinstance(param.default, (tuple, list)):
            stated[flag] = str(param.default)
        elif worded:
            stated[flag] = worded.group(1)
    return stated


@pytest.mark.parametrize("name", COMMANDS)
def test_the_pages_synopsis_gives_no_option_a_value_other_than_its_stated_default(name):
    stated, shown = _stated_defaults(cli.commands[name]), _synopsis_values(name)
    compared = {flag: value for flag, value in shown.items() if flag in stated and not value.isupper()}
    assert compared, f"nothing compared for {name}: the synopsis' form changed"
    for flag, value in compared.items():
        assert value == stated[flag], f"autofit {name} {flag}: the page shows {value}, --help says {stated[flag]}"
