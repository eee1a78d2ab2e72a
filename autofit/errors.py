"""One root for every error autofit raises on purpose, so the CLI can turn them into one line."""

from __future__ import annotations


class AutofitError(Exception):
    """Base of autofit's own errors: a message meant for the user, no traceback needed."""


class UsageError(AutofitError):
    """The user asked for something that cannot work (bad flag value, missing file, ...)."""


class ConfigFileError(AutofitError):
    """A best-config JSON file is missing, corrupt, or of another schema version."""


class StorageError(AutofitError):
    """The study storage cannot be opened or written."""


class NoFeasibleConfig(AutofitError):
    """A search ended without any configuration that fits."""


class UserCodeError(AutofitError):
    """The user's training function raised on every probe: a bug to fix, not a config to skip."""
