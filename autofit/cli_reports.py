"""CLI commands that read stored studies: show, studies, export, report (wiring only)."""

from __future__ import annotations
