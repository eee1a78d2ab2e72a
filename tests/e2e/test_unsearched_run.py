"""Before any search, a decorated function (or a script's `autofit.start`) trains what it declared, and says
so: a declared global batch is kept, the script's own micro-batch and precision are taken, the batch range
and precisions hold, and the global batch is never one micro-batch unless it is small."""

from __future__ import annotations

import pytest

from autofit import Config, autofit
from autofit.options import SearchOptions


@pytest.mark.parametrize(("declared", "expected"), [
    ({}, Config(32)),
    ({"global_batch": 16}, Config(16)),
    ({"global_batch": 64, "default_batch_size": 16}, Config(16, accumulation_steps=4)),
    ({"global_batch": 96, "batch_range": (1, 64)}, Config(32, accumulation_steps=3)),
    # never the whole global batch at once: nanoGPT's 480 as one micro-batch ran an H100 out of memory
    ({"global_batch": 480}, Config(32, accumulation_steps=15)),
    ({"global_batch": 480, "default_batch_size": 12, "default_precision": "bfloat16"},
     Config(12, "bf16", accumulation_steps=40)),
    ({"default_precision": "torch.float16"}, Config(32, "fp16")),
    ({"default_batch_size": 8}, Config(8)),
    ({"batch_range": (1, 8)}, Config(8)),
    ({"precision": ("bf16", "fp32")}, Config(32)),
    ({"precision": ("bf16",)}, Config(32, "bf16")),
])
def test_the_unsearched_config_follows_the_declaration(declared, expected):
    assert SearchOptions(**declared).unsearched_config()[0] == expected


def test_a_decorated_call_without_a_search_trains_the_declared_global_batch(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no best-config file anywhere
    monkeypatch.delenv("AUTOFIT_CONFIG", raising=False)
    seen = {}

    @autofit(global_batch=16)
    def train(run):
        seen.update(batch=run.batch_size, accumulation=run.accumulation_steps, global_batch=run.global_batch)

    train()
    assert seen == {"batch": 16, "accumulation": 1, "global_batch": 16}
    assert "running with defaults: fp32 b=16 (global batch 16 as declared)" in capsys.readouterr().err


@pytest.mark.parametrize("confirmed", [True, False])
def test_the_first_line_says_when_the_winner_was_never_confirmed(tmp_path, monkeypatch, capsys, confirmed):
    import json
    import os

    from tests.support import REPO

    monkeypatch.delenv("AUTOFIT_MEMORY_LIMIT", raising=False)  # this process must keep its own memory
    document = json.load(open(os.path.join(REPO, "autofit", "recorded", "gpt.train.best.json")))
    document["measured"]["confirmed"] = confirmed
    path = tmp_path / "best.json"
    path.write_text(json.dumps(document))

    @autofit
    def train(run):
        return run.config

    assert train(autofit_config=str(path)) == Config(48, precision="bf16")
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("autofit: running train with the best config from") and "bf16 b=48" in first
    reason = document["measured"].get("unconfirmed") or "the search ended before a longer run could measure it"
    assert (f"(unconfirmed: {reason}" in first) is not confirmed  # the file's own reason
