"""The study plots name what a search climbs: the micro-batch size, or by tokens the token cap. White-box:
the figures are drawn from a frame of three probes (autofit.report._plots)."""
from __future__ import annotations

import pandas as pd
import pytest

from autofit.config import SAMPLES, TOKENS
from autofit.export import MemoryBudget
from autofit.report._plots import memory_figure, throughput_figure

pytest.importorskip("matplotlib")


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"status": ["ok", "ok", "oom"], "batch_size": [1024, 2048, 4096],
                         "label": ["fp32 b=1024", "fp32 b=2048", "fp32 b=4096"],
                         "precision": ["fp32"] * 3, "checkpoint_segments": [0] * 3, "checkpoint_policy": ["full"] * 3,
                         "accumulation_steps": [1] * 3, "feasible": [True, True, False],
                         "samples_per_s": [40.0, 50.0, None], "tokens_per_s": [9000.0, 11000.0, None],
                         "peak_bytes": [300 * 2**20, 500 * 2**20, None]})


@pytest.mark.parametrize("rate, name", [(SAMPLES, "micro-batch size"), (TOKENS, "token cap (max_tokens)")])
def test_the_x_axis_and_titles_name_the_size_the_search_climbs(rate, name):
    throughput = throughput_figure(_frame(), ranked_by=rate).axes[0]
    memory = memory_figure(_frame(), MemoryBudget.of(2**30, 0.1), ranked_by=rate).axes[0]
    for ax in (throughput, memory):
        assert ax.get_xlabel() == f"{name} (log scale)"
        assert f"against {name}" in ax.get_title()
