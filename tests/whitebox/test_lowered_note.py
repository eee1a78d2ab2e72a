"""White box: the note a search adds when a real run with its previous answer lowered its config reads that run's
record (`runtime.LoweredRun`) by attribute: the config it started with, the first lowering and where it ended."""

from __future__ import annotations

from autofit.config import Config
from autofit.runtime import Lowering, lowered_path, record_lowerings
from autofit.search._phases import _lowered_run_note


def test_the_search_names_the_real_run_s_first_lowering_and_where_it_ended(tmp_path):
    best = str(tmp_path / "train.train.cpu.best.json")
    assert _lowered_run_note(best) is None  # no run recorded one
    start = Config(batch_size=32)
    first = Lowering(3, "backward", start, Config(batch_size=16, accumulation_steps=2), None, 1_764_000_000.0)
    second = Lowering(7, "forward", first.after, Config(batch_size=8, accumulation_steps=4), None, 1_764_000_060.0)
    record_lowerings(lowered_path(best), start, [first, second], "/abs/train.py")
    note = _lowered_run_note(best)
    assert note.startswith("a real run of fp32 b=32 ran out of memory at step 3 (backward) and went on with "
                           "fp32 b=8 acc=4 (")
