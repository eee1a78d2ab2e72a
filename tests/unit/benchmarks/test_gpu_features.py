"""The GPU checklist's `features` step (benchmarks/gpu/features.py): the figures it reads from the token
benchmark's table and the dated table it writes. Its figures come from running it on a GPU."""
from __future__ import annotations

import os

from benchmarks.gpu.features import PARTS, Row, _table_rows, table


def test_the_token_row_is_read_from_the_benchmarks_table_as_it_writes_it(tmp_path):
    from argparse import Namespace

    from autofit.config import Config
    from benchmarks.tokens import STRATEGIES, write_table

    def rounds(*rates: float) -> list[dict]:
        return [{"tokens_per_s": r, "finished": True, "padding": 0.1, "lowerings": 0, "guard": 0, "oom_split": 0}
                for r in rates]

    configs = dict(zip(STRATEGIES, (Config(batch_size=73), Config(batch_size=64), Config(batch_size=8192,
                                    max_tokens=8192), Config(batch_size=3072, max_tokens=3072))))
    runs = dict(zip(STRATEGIES, (rounds(7000, 7200), rounds(7000, 7000), rounds(30000, 31000),
                                 rounds(35000, 36000))))
    out = tmp_path / "tokens-cuda.md"
    args = Namespace(memory_limit="2GiB", budget="3m", rounds=2, samples=64, device="cuda", out=str(out))
    write_table(args, configs, runs, dict.fromkeys(STRATEGIES, 60.0), {"device": {"name": "GPU"}}, 600.0)
    rows = _table_rows(str(out))
    safe, found = rows["(a) fixed, safe"], rows["(d) autofit"]
    assert safe[1] == "fp32 b=73" and safe[3] == "7,100"
    assert found[1] == "fp32 max_tokens=3072" and found[4] == "5.00x"  # the bold and the range taken off
    assert found[5] == "0"  # OOMs caught


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
    features.main()
    text = (out / "features.md").read_text()
    assert "--out <out>/tokens-cuda.md" in text and "sqlite:///<out>/features.db" in text, text
    assert "<out>/medium.best.json" in text
    assert str(tmp_path) not in text
    assert str(tmp_path) not in json.dumps(json.loads((out / "features.json").read_text())["rows"])
    inside = os.path.join(features.REPO, "out", "gpu")
    rows = features.portable([Row("f", "see out/gpu", f"python x.py --out {inside}/a.json "
                                                      f"--storage sqlite:///{inside}/features.db")], inside)
    assert rows[0].command == "python x.py --out out/gpu/a.json --storage sqlite:///out/gpu/features.db"
