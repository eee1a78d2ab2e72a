"""The GPU checklist's `features` step (benchmarks/gpu/features.py): the figures it reads from the token
benchmark's table and the dated table it writes. Its figures come from running it on a GPU."""
from __future__ import annotations

import os

from benchmarks.gpu.features import PARTS, Row, _table_rows, table
from tests.support import REPO


def test_the_token_row_is_read_from_the_benchmarks_table_as_it_writes_it():
    rows = _table_rows(os.path.join(REPO, "benchmarks", "tokens-cpu.md"))
    safe, found = rows["(a) fixed, safe"], rows["(d) autofit"]
    assert safe[1] == "fp32 b=73" and safe[3] == "7,186"
    assert found[1] == "fp32 max_tokens=3072" and found[4] == "4.63x"  # the bold and the range taken off
    assert found[5] == "0"  # OOMs caught


def test_the_table_has_one_dated_row_per_figure_with_its_command():
    text = table([Row("batches by tokens", "2.1x the safe fixed batch", "python -m benchmarks.tokens")],
                 "NVIDIA H200", "2026-11-28")
    assert text.splitlines()[0] == "| feature | GPU | figure | date | command |"
    assert text.splitlines()[2] == ("| batches by tokens | NVIDIA H200 | 2.1x the safe fixed batch | 2026-11-28 | "
                                    "`python -m benchmarks.tokens` |")
    assert set(PARTS) == {"tokens", "memory", "estimator", "hf"}
