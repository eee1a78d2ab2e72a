"""The GPU checklist's `features` step (benchmarks/gpu/features.py): the figures it reads from the token
benchmark's table and the dated table it writes. Its figures come from running it on a GPU."""
from __future__ import annotations

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
    assert set(PARTS) == {"tokens", "memory", "estimator", "offload", "hf"}


def test_the_offload_row_reads_both_probes_records(tmp_path, monkeypatch):
    from benchmarks.gpu import features

    records = {False: {"status": "ok", "peak_bytes": 40 * 2**30, "samples_per_s": 100.0},
               True: {"status": "ok", "peak_bytes": 10 * 2**30, "samples_per_s": 55.0}}
    monkeypatch.setattr(features, "_probed", lambda args, log: records["--offload-activations" in args])
    row = PARTS["offload"](str(tmp_path))[0]
    assert row.figure == "bf16 b=32: peak 40.0 -> 10.0 GiB (-75%), 100.0 -> 55.0 samples/s (-45%)"
    assert row.command.startswith("python -m autofit.cli probe benchmarks/gpu/gpt124m.py --gpu 0 --precision bf16")
    records[True] = {"status": "oom"}
    assert "no figure: probes ok, oom" in PARTS["offload"](str(tmp_path))[0].figure
