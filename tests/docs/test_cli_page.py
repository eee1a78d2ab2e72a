"""docs/reference/cli.md agrees with the commands (issue 37, item 11): its synopsis names every option each
command's --help shows and no other, shows no default that is not one, and every AUTOFIT_* variable the
package reads is in the page's one table of them."""

from __future__ import annotations

import os
import re

import click

from autofit.cli import cli
from tests.support import REPO

PAGE = os.path.join(REPO, "docs", "reference", "cli.md")
SYNOPSIS_COMMANDS = ("search", "probe", "estimate", "devices", "forecast")


def _synopsis() -> dict[str, str]:
    page = open(PAGE, encoding="utf-8").read()
    block = page.split("```", 2)[1]
    commands: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        found = re.match(r"autofit (\w+)", line)
        if found:
            current = found.group(1)
        if current:
            commands[current] = commands.get(current, "") + " " + line
    return commands


def _flags(command: click.Command) -> set[str]:
    flags = set()
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            flags.update(f for f in (*param.opts, *param.secondary_opts) if f.startswith("--"))
    return flags - {"--help"}


def test_the_synopsis_names_every_option_of_each_command_and_no_other():
    synopsis = _synopsis()
    for name in SYNOPSIS_COMMANDS:
        shown = set(re.findall(r"--[a-z][a-z0-9-]*", synopsis[name]))
        assert shown == _flags(cli.commands[name]), name


def test_the_environment_variables_are_in_one_table():
    read = set()
    for root, _, files in os.walk(os.path.join(REPO, "autofit")):
        for name in files:
            if name.endswith(".py"):
                read.update(re.findall(r"\"(AUTOFIT_[A-Z_]+)\"", open(os.path.join(root, name)).read()))
    page = open(PAGE, encoding="utf-8").read()
    table = page.split("## Environment variables", 1)[1]
    listed = set(re.findall(r"^\| `(AUTOFIT_[A-Z_]+)", table, flags=re.MULTILINE))
    assert read and listed == read
