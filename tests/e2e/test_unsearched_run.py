"""Before any search, a decorated function (or a script's `autofit.start`) trains what it declared, and says
so: a declared global batch is kept, the script's own micro-batch and precision are taken, the batch range
and precisions hold, and the global batch is never one micro-batch unless it is small."""

from __future__ import annotations

import pytest

from autofit import Config, autofit
from autofit.options import SearchOptions


@pytest.mark.parametrize(("declared", "expected"), [
    ({}, Config(batch_size=32)),
    ({"global_batch": 16}, Config(batch_size=16)),
    ({"global_batch": 64, "default_batch_size": 16}, Config(batch_size=16, accumulation_steps=4)),
    ({"global_batch": 96, "batch_range": (1, 64)}, Config(batch_size=32, accumulation_steps=3)),
    # never the whole global batch at once: nanoGPT's 480 as one micro-batch ran an H100 out of memory
    ({"global_batch": 480}, Config(batch_size=32, accumulation_steps=15)),
    ({"global_batch": 480, "default_batch_size": 12, "default_precision": "bfloat16"},
     Config(batch_size=12, precision="bf16", accumulation_steps=40)),
    ({"default_precision": "torch.float16"}, Config(batch_size=32, precision="fp16")),
    ({"default_batch_size": 8}, Config(batch_size=8)),
    ({"batch_range": (1, 8)}, Config(batch_size=8)),
    ({"precision": ("bf16", "fp32")}, Config(batch_size=32)),
    ({"precision": ("bf16",)}, Config(batch_size=32, precision="bf16")),
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
    err = capsys.readouterr().err
    assert "running with defaults: fp32 b=16 (global batch 16 as declared)" in err
    assert err.startswith("autofit: on cpu (no GPU is visible), no best config found for train")  # where, and why


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

    exported = Config.from_dict(document["config"])  # the bundled study's winner (bf16 b=64 since issue 44)
    assert train(autofit_config=str(path)) == exported
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("autofit: on cpu (no GPU is visible), running train with the best config from")
    assert exported.label() in first
    reason = document["measured"].get("unconfirmed") or "the search ended before a longer run could measure it"
    assert (f"(unconfirmed: {reason}" in first) is not confirmed  # the file's own reason


def test_a_best_config_file_of_another_global_batch_is_not_trained_with(tmp_path, monkeypatch, capsys):
    """A study resumed with other options once exported a config at a global batch of 480 for a function that
    declares 240: its normal run then trained the wrong global batch without a word. Now the file found beside
    the script is set aside, said so, and the declared global batch trains."""
    import json
    import os

    from autofit.export import default_best_path, device_tag
    from tests.support import REPO

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOFIT_CONFIG", raising=False)
    monkeypatch.setenv("AUTOFIT_DEVICE", "cpu")

    @autofit(global_batch=240)
    def train(run):
        return run.config

    document = json.load(open(os.path.join(REPO, "autofit", "recorded", "gpt.train.best.json")))
    document["config"].update(batch_size=48, accumulation_steps=10, global_batch=480)
    path = default_best_path(__file__, "train", "studies", device_tag("cpu"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        json.dump(document, handle)
    assert train() == Config(batch_size=30, accumulation_steps=8)  # the declared 240: 32 at most a micro-batch, a divisor
    err = capsys.readouterr().err
    assert "keeps a global batch of 480, not the 240 train declares" in err and "running with defaults" in err
