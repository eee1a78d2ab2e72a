"""The package version, in one place (the package, the best-config file and the report read it)."""

__version__ = "0.1.0"
