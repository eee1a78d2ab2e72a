from __future__ import annotations

import os
import sys
from contextlib import contextmanager, nullcontext

import pytest

from tests.support import REPO  # noqa: F401 - tests/test_layout.py reads it from here


@pytest.fixture(scope="session")
def postgres_base():
    """One real PostgreSQL server for the session (tests/support/postgres.py); each test makes its own
    database. Its folder is outside pytest's (private to root), where Debian's postgres user can reach it."""
    import shutil
    import tempfile

    from tests.support.postgres import postgres_server

    folder = tempfile.mkdtemp(prefix="autofit-postgres-")
    os.chmod(folder, 0o755)
    try:
        with postgres_server(folder) as url:
            yield url
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_base, request):
    """A fresh database on the session's PostgreSQL server."""
    import re

    from tests.support.postgres import create_database

    return create_database(postgres_base, "t_" + re.sub(r"\W", "_", request.node.name)[:50].lower())


@pytest.fixture(autouse=True)
def _the_checkout_stays_as_it_was():
    """Tests write only to temporary folders: a study or a probe's log left in the checkout's studies/ is
    what a newcomer's next `autofit show` reads (issue 37, item 10). Fails the test that left one."""
    from tests.support import STUDIES

    def listing() -> set[str]:
        found = set()
        for root, _, files in os.walk(STUDIES):
            if "__pycache__" not in root:  # a study script imported: Python's own cache
                found.update(os.path.relpath(os.path.join(root, name), STUDIES) for name in files)
        return found

    before = listing()
    yield
    left = sorted(listing() - before)
    assert not left, f"the test wrote into the checkout's studies/: {left}"


@pytest.fixture(autouse=True)
def _allocator_settings_stay_the_tests():
    """A normal run in this process sets the allocator's variables in the environment (what its file records, or
    autofit's default on CUDA), as it does in a user's process: each test's are taken back after it."""
    names = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    before = {name: os.environ.get(name) for name in names}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def pytest_collection_modifyitems(config, items):
    """`gpu` tests skip where torch sees no CUDA device (torch is imported only when one is selected)."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device: torch.cuda.is_available() is False")
        for item in gpu:
            item.add_marker(skip)


# Every search a test starts (in this process or a subprocess) measures its final A/B over one probe's steps
# per entrant, one round, rather than 10 probes' steps in 3 rounds: the tests check what a search decides, not
# how long it measures; the tests of the confirmation's length set `confirm_factor` themselves.
os.environ.setdefault("AUTOFIT_CONFIRM_FACTOR", "1")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist (`-n 2`), a test marked `serial` (a tight budget, or a speed it measures) runs
    alone: it waits for the test on the other worker to end, and that worker waits for it. A readers-writer
    lock on files the workers share, held over the test's whole protocol (the module fixtures it sets up
    included); every test passes the turnstile first, so a stream of other tests cannot starve a serial one.
    One process without xdist runs one test at a time anyway."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        yield
        return
    import fcntl
    import tempfile

    base = os.path.join(tempfile.gettempdir(), f"autofit-tests-{run}")
    alone = item.get_closest_marker("serial") is not None
    with open(base + ".turnstile", "a") as turnstile, open(base + ".lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            with nullcontext() if alone else _a_share_of_the_cores():
                yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)


@contextmanager
def _a_share_of_the_cores():
    """A test that shares the machine with the other workers' gets its share of the cores as its
    intra-op threads (OMP_NUM_THREADS for the probes and runs it starts, torch's own in this process):
    two tests of two OpenMP threads each on two cores spin against each other (the heavy tiers' pool took
    47 min on the 2-core EPYC, 37 min with the share). A test that needs a thread count pins its own; one
    marked `serial` runs alone with the machine's default."""
    cores = len(os.sched_getaffinity(0))
    share = str(max(1, cores // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
    before = os.environ.get("OMP_NUM_THREADS")
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    os.environ["OMP_NUM_THREADS"] = share
    if torch is not None:
        torch.set_num_threads(int(share))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = before
        if torch is not None and threads is not None:
            torch.set_num_threads(threads)
