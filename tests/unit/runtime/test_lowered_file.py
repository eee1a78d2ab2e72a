"""The file a real run writes when it lowers its config (`autofit.lowered/1`, beside its best-config file) has one
owner both ways: `LoweredRun`, written by `record_lowerings` and read back by `read_lowerings`, which the next
search's note reads by attribute."""

from __future__ import annotations

import json

from autofit.config import Config
from autofit.runtime import Lowering, LoweredRun, lowered, lowered_path, read_lowerings, record_lowerings


def test_a_run_s_lowerings_read_back_as_they_were_written(tmp_path):
    start = Config(batch_size=32)
    first = Lowering(3, "backward", start, lowered(start), 2**30, 1_764_000_000.0)
    second = Lowering(5, "forward", first.after, lowered(first.after), None, 1_764_000_060.0)
    path = lowered_path(str(tmp_path / "train.train.cpu.best.json"))
    record_lowerings(path, start, [first, second], "/abs/train.py")
    read = read_lowerings(path)
    assert read == LoweredRun(started_with=start, lowerings=(first, second), script="/abs/train.py")
    assert read.ended_with == Config(batch_size=8, accumulation_steps=4)
    with open(path) as handle:
        assert json.load(handle)["ended_with"] == read.ended_with.to_dict()  # the file still says where it ended


def test_a_file_that_is_not_a_run_s_lowerings_reads_as_none(tmp_path):
    (tmp_path / "other.json").write_text(json.dumps({"schema": "autofit.best-config"}))
    (tmp_path / "broken.json").write_text(json.dumps({"schema": "autofit.lowered/1", "lowerings": []}))
    assert read_lowerings(str(tmp_path / "missing.json")) is None
    assert read_lowerings(str(tmp_path / "other.json")) is None
    assert read_lowerings(str(tmp_path / "broken.json")) is None  # no config it started with: nothing to say
