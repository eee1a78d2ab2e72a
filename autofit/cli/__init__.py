"""The `autofit` command line: click wiring only; the work is in the library modules.

_commands: probe, search, devices (and the group); _reports: show, studies, export, report;
_types: click parameter types for sizes, durations and lists.
"""

from autofit.cli import _reports  # noqa: F401  (registers show, studies, export, report)
from autofit.cli._commands import cli, main

__all__ = ["cli", "main"]
