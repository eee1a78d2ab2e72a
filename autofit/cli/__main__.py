"""`python -m autofit.cli`: the same as the `autofit` command."""

from autofit.cli import main

main()
