"""The example notebook runs top to bottom on the recorded studies, and draws its plots."""
from __future__ import annotations

import os

import pytest

from tests.support import REPO

NOTEBOOK = os.path.join(REPO, "notebooks", "explore_study.ipynb")


@pytest.mark.packaging
def test_explore_study_notebook_runs_without_errors():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 4  # throughput, memory, progress, ranking
    assert any("text/html" in o.get("data", {}) for o in outputs)  # the frame, as a table
