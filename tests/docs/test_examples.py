"""The documentation's Python examples run: every ```python block of a docs/ page, in order, in one
namespace per page (Sybil). Blocks that need a GPU, a framework or a long search are shown as ```py
and not run. Skipped where Sybil is not installed (it comes with the `test` extra)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("sybil")

from sybil import Sybil  # noqa: E402
from sybil.parsers.myst import PythonCodeBlockParser  # noqa: E402

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = sorted(page for page in DOCS.rglob("*.md") if "_build" not in page.parts
               and "```python" in page.read_text(encoding="utf-8"))


def test_the_guide_and_the_reference_have_examples_that_run():
    names = {str(page.relative_to(DOCS)) for page in PAGES}
    assert {"guide/train-function.md", "guide/your-loop.md", "guide/questions.md", "reference/api.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(DOCS)))
def test_the_pages_python_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)  # a normal run looks for studies/ here, and writes nothing into the checkout
    for name in ("AUTOFIT_CONFIG", "AUTOFIT_DEVICE", "AUTOFIT_MEMORY_LIMIT", "AUTOFIT_RUN_REPORT"):
        monkeypatch.delenv(name, raising=False)
    examples = list(Sybil([PythonCodeBlockParser()]).parse(page))
    assert examples, f"{page} has a ```python block Sybil did not find"
    for example in examples:
        example.evaluate()
