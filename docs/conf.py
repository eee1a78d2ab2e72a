"""Sphinx configuration of autofit's documentation site (build: sphinx-build -W -b html docs docs/_build/html)."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))  # the autofit of this checkout, installed or not
sys.path.insert(0, os.path.abspath("_ext"))  # knob_table: the config fields' table, from their declaration

from autofit import __version__  # noqa: E402

project = "autofit"
author = "the autofit authors"
release = version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_click",
    "knob_table",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext"]
myst_heading_anchors = 3  # `page.md#a-section` links, as GitHub makes them
myst_enable_extensions = ["colon_fence"]

html_theme = "furo"
html_title = f"autofit {release}"

autodoc_member_order = "bysource"
autodoc_typehints = "description"
# The docstrings name code with single backticks, as Markdown does: show it as code.
default_role = "code"
# "--flag" stays two hyphens in text (the knob table's help, prose), never an en dash.
smartquotes = False
# Lexers for the shown-only blocks (```py: not run by the tests; ```python blocks are).
highlight_language = "python"
