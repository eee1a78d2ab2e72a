"""The `autofit` command line: click wiring only; the work is in the library modules.

_commands: probe, search, estimate, devices (and the group); _reports: show, studies, export, report;
_context: the context object (the device and storage the options name) and the click exceptions
autofit's errors leave as; _types: click parameter types for sizes, durations and lists.
"""

from autofit.cli import _reports  # noqa: F401  (registers show, studies, export, report)
from autofit.cli._commands import cli, main

__all__ = ["cli", "main"]
