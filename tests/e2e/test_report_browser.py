"""The HTML report (`autofit report`) opened in a real headless Chromium: it renders, every figure
loads and decodes, and the browser reports no console error, exception or failed load. Built from
the bundled recorded study (no search). Skipped where no Chromium is on PATH
(Debian: `apt-get install -y chromium`)."""
from __future__ import annotations

import base64

import pytest
from click.testing import CliRunner

from autofit.cli import cli
from autofit.study import bundled_storage_url
from tests.support import REPORT_SECTIONS
from tests.support.browser import chromium, open_page

pytestmark = [pytest.mark.packaging,
              pytest.mark.skipif(chromium() is None, reason="no chromium on PATH (apt-get install -y chromium)")]


def test_the_report_renders_with_its_figures_and_no_console_errors(tmp_path):
    out = tmp_path / "report.html"
    made = CliRunner().invoke(cli, ["report", "--storage", bundled_storage_url(), "--study", "gpt", "--out", str(out)],
                              catch_exceptions=False)
    assert made.exit_code == 0, made.output
    page = open_page(str(out), chromium())
    assert page.errors == []
    assert page.title == "autofit report: gpt.train-cpu0"
    assert page.headings[0] == "autofit report: gpt.train-cpu0"
    assert [title for _, title in REPORT_SECTIONS] == page.headings[1:1 + len(REPORT_SECTIONS)]
    assert [image["alt"] for image in page.images] == [title for _, title in REPORT_SECTIONS]
    for image in page.images:
        assert image["complete"] and image["naturalWidth"] >= 600 and image["naturalHeight"] >= 300, image


def test_the_browser_check_sees_a_figure_that_does_not_load_and_a_console_error(tmp_path):
    """The harness itself: a page with a broken image and a script error must not pass as clean."""
    good = base64.b64encode(bytes.fromhex(  # a 1x1 PNG
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082")).decode()
    page_path = tmp_path / "broken.html"
    page_path.write_text(
        "<!DOCTYPE html><html><head><title>broken</title></head><body><h1>x</h1>"
        f"<img alt=\"fine\" src=\"data:image/png;base64,{good}\">"
        "<img alt=\"broken\" src=\"data:image/png;base64,AAAA\">"
        "<script>console.error('drawn wrong'); undefinedFunction();</script></body></html>")
    page = open_page(str(page_path), chromium())
    widths = {image["alt"]: image["naturalWidth"] for image in page.images}
    assert widths == {"fine": 1, "broken": 0}
    assert any("drawn wrong" in line for line in page.errors), page.errors
    assert any("undefinedFunction" in line for line in page.errors), page.errors
