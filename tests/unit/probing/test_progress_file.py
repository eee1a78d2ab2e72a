"""A probe's progress file (autofit.probing's ProgressFile) never takes its probe down: a probe that ran out of
memory has none left for the thread that flushes its last count (`RuntimeError: can't start new thread`), and the
probe's own record (out of memory) must still reach the search, not "cannot join thread before it is started"
(seen on the Accelerate corpus script's probe under a 480 MiB limit)."""

from __future__ import annotations

import threading

from autofit.probing import ProgressFile, read_progress


def test_no_thread_to_start_leaves_the_counts_written_and_the_context_closes(tmp_path, monkeypatch):
    def no_memory(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_memory)
    path = str(tmp_path / "progress.json")
    with ProgressFile(path) as progress:
        progress(1, 0)
        progress(2, 0)  # within the second: kept for a flush no thread will do
    assert read_progress(path) == (1, 0)


def test_the_flusher_writes_the_last_count_within_a_second(tmp_path):
    path = str(tmp_path / "progress.json")
    with ProgressFile(path) as progress:
        progress(1, 0)
        progress(2, 1)
        deadline = threading.Event()
        for _ in range(30):
            if read_progress(path) == (2, 1):
                break
            deadline.wait(0.1)
    assert read_progress(path) == (2, 1)
