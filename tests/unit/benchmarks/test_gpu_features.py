"""The GPU checklist's `features` step (benchmarks/gpu/features.py): the figures it reads from the token
benchmark's table and the dated table it writes. Its figures come from running it on a GPU."""
from __future__ import annotations

import os

from benchmarks.gpu.features import PARTS, Row, table


def test_the_token_row_sets_the_picks_epoch_against_the_plain_loop_and_its_probe(tmp_path, monkeypatch):
    """Issue 53's row: the pick's whole epoch against the plain loop's best fixed batch in bf16 and in the pick's
    precision, its probe over its epoch, and the best bf16 and tf32 configs the search measured."""
    from benchmarks.gpu import features

    best = {"config": {"batch_size": 8192, "max_tokens": 8192, "precision": "tf32", "pad_multiple": 64},
            "measured": {"tokens_per_s": 500_000.0},
            "runner_ups": [{"config": {"batch_size": 6144, "max_tokens": 6144, "precision": "bf16"},
                            "tokens_per_s": 80_000.0}]}
    monkeypatch.setattr(features, "_search", lambda *a, **k: (["python", "-m", "autofit.cli", "search"], best))
    monkeypatch.setattr(features, "_normal_run", lambda *a, **k: {"tokens_per_s": 450_000.0})
    plain = {("bf16", 32): 34_500.0, ("tf32", 64): 90_000.0, ("tf32", 32): 60_000.0}
    monkeypatch.setattr(features, "_fixed_epoch", lambda best, precision, batch, out: plain.get((precision, batch)))
    figure = PARTS["tokens"](str(tmp_path))[0].figure
    assert figure == ("tf32 max_tokens=8192 pad=64: its whole epoch 450,000 real tokens/s; 13.04x the plain loop's "
                      "best fixed batch in bf16 (b=32, 34,500); 5.00x the plain loop's best fixed batch in tf32 (b=64, "
                      "90,000); probe ÷ epoch 1.11; best probed bf16 bf16 max_tokens=6144 80,000, tf32 tf32 "
                      "max_tokens=8192 pad=64 500,000")


def test_the_table_has_one_dated_row_per_figure_with_its_command():
    text = table([Row("batches by tokens", "2.1x the safe fixed batch", "python -m benchmarks.tokens")],
                 "NVIDIA H200", "2026-11-28")
    assert text.splitlines()[0] == "| feature | GPU | figure | date | command |"
    assert text.splitlines()[2] == ("| batches by tokens | NVIDIA H200 | 2.1x the safe fixed batch | 2026-11-28 | "
                                    "`python -m benchmarks.tokens` |")
    assert set(PARTS) == {"tokens", "memory", "estimator", "offload", "allocator", "hf"}


def test_the_offload_rows_read_both_probes_records_against_the_goal_and_the_host_link(tmp_path, monkeypatch):
    from benchmarks.gpu import features

    records = {False: {"status": "ok", "peak_bytes": 40 * 2**30, "samples_per_s": 100.0},
               True: {"status": "ok", "peak_bytes": 10 * 2**30, "samples_per_s": 55.0,
                      "allocator": {"host_pinned_peak_bytes": 32 * 2**30}}}
    monkeypatch.setattr(features, "_probed", lambda args, log: records["--offload-activations" in args])
    monkeypatch.setattr(features, "_host_link", lambda: (50e9, 60e9))
    alone, checkpointed = PARTS["offload"](str(tmp_path))
    ceiling = 32 / (30 * 2**30 / 50e9 + 30 * 2**30 / 60e9)
    assert alone.figure == ("bf16 b=32: peak 40.0 -> 10.0 GiB (-75%), 100.0 -> 55.0 samples/s (-45%), pinned host "
                            "32.0 GiB; goal (at most 15% slower, at least 40% saved) not met; the host link moves "
                            f"30.0 GiB each way at 50.0/60.0 GB/s: at most {ceiling:,.1f} samples/s")
    assert alone.command.startswith("python -m autofit.cli probe benchmarks/gpu/gpt124m.py --gpu 0 --precision bf16")
    assert "--checkpoint-segments 12" in checkpointed.command and "over full checkpointing" in checkpointed.feature
    records[True] = {**records[True], "samples_per_s": 90.0}
    assert "goal (at most 15% slower, at least 40% saved) met" in PARTS["offload"](str(tmp_path))[0].figure
    records[True] = {"status": "oom"}
    assert "no figure: probes ok, oom" in PARTS["offload"](str(tmp_path))[0].figure


def test_the_allocator_rows_read_each_probes_retries_with_the_default_settings_and_without(tmp_path, monkeypatch):
    from benchmarks.gpu import features

    seen = []

    def probed(args, log, env=None):
        seen.append(env.get("PYTORCH_CUDA_ALLOC_CONF"))
        if "4" in args and env.get("PYTORCH_CUDA_ALLOC_CONF"):
            return {"status": "oom"}
        return {"status": "ok", "peak_bytes": 13 * 2**30, "samples_per_s": 30.0,
                "alloc_retries": 0 if env.get("PYTORCH_CUDA_ALLOC_CONF") is None else 3}

    monkeypatch.setattr(features, "_probed", probed)
    at3, at4 = PARTS["allocator"](str(tmp_path))
    assert seen == [None, "expandable_segments:False"] * 2  # the default: nothing set on top of autofit's own
    assert at3.figure == ("expandable segments (autofit's default): peak 13.00 GiB, 30.0 samples/s, 0 retries in its "
                          "measured steps; off: peak 13.00 GiB, 30.0 samples/s, 3 retries in its measured steps")
    assert at4.figure.endswith("; off: oom") and "b=4" in at4.feature
def test_the_table_writes_the_out_folder_relative_never_as_this_machines_path(tmp_path, monkeypatch):
    """The table goes into docs/benchmarks.md: its commands name the --out folder relative to the repository
    (where they run), or as `<out>` outside it, never as the absolute path of the machine that ran them."""
    import json
    import sys

    import torch

    from benchmarks.gpu import features

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    monkeypatch.setattr(features, "_run", lambda args, log, timeout, env=None: (1, ""))  # every command fails fast
    out = tmp_path / "gpu"
    monkeypatch.setattr(sys, "argv", ["features", "--parts", "tokens,memory", "--out", str(out)])
    monkeypatch.setenv("LIMIT_MEMORY", "20GiB")  # the memory part's cap given: its search runs (and fails)
    features.main()
    text = (out / "features.md").read_text()
    assert "--out <out>/tokens.best.json" in text and "sqlite:///<out>/features.db" in text, text
    assert "llama" in text
    assert str(tmp_path) not in text
    assert str(tmp_path) not in json.dumps(json.loads((out / "features.json").read_text())["rows"])
    inside = os.path.join(features.REPO, "out", "gpu")
    monkeypatch.delenv("LIMIT_MEMORY")  # the cap measured: without a GPU its probes cannot run, and the row says so
    features.main()
    assert "no figure: the cap's probes did not run" in (out / "features.md").read_text()
    rows = features.portable([Row("f", "see out/gpu", f"python x.py --out {inside}/a.json "
                                                      f"--storage sqlite:///{inside}/features.db")], inside)
    assert rows[0].command == "python x.py --out out/gpu/a.json --storage sqlite:///out/gpu/features.db"
