"""Optuna storages: open one for a search (created if new, with heartbeats where the backend has
them), and name the default one. Reading stored studies (which must exist) is in autofit.study._stored."""

from __future__ import annotations

import contextlib
import os
import time
import warnings

import optuna

from autofit.errors import StorageError

#: A searcher records a heartbeat on its running trial this often (RDB storages: SQLite, PostgreSQL,
#: MySQL); a running trial without one for STALE_AFTER_S belonged to a searcher that died.
HEARTBEAT_S = 10
STALE_AFTER_S = 60

DEFAULT_DIR = "studies"
DEFAULT_DB = "autofit.db"


def default_storage_url(directory: str = DEFAULT_DIR) -> str:
    return "sqlite:///" + os.path.abspath(os.path.join(directory, DEFAULT_DB))


def open_storage(url: str | None) -> optuna.storages.BaseStorage:
    """An Optuna storage, or a StorageError saying why it cannot be used (before any probe runs)."""
    url = url or default_storage_url()
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        directory = os.path.dirname(os.path.abspath(path)) or "."
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"The storage {url} must be writable, but its folder cannot be made: {exc.strerror}.") from None
        if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
            raise StorageError(f"The storage {url} must be writable, but {path} is not.")
    driver_url = engine_url(url)
    for attempt in range(3):
        try:
            if url.endswith(".journal") or url.endswith(".log"):
                from optuna.storages.journal import JournalFileBackend

                return optuna.storages.JournalStorage(JournalFileBackend(url))
            kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
            with quiet_heartbeat_warnings():
                return optuna.storages.RDBStorage(driver_url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S,
                                                  grace_period=STALE_AFTER_S)
        except Exception as exc:  # noqa: BLE001 - any driver error means the same thing to the user
            # Two searches creating the same new database race on its schema: the loser retries.
            racing = ("UNIQUE constraint failed", "already exists", "database is locked")
            if attempt < 2 and any(text in str(exc) for text in racing):
                time.sleep(0.5 + attempt)
                continue
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StorageError(f"The storage {url} must open, but it failed: {first[:300]}") from None
    raise AssertionError("unreachable")


def engine_url(url: str) -> str:
    """A PostgreSQL URL with the driver autofit installs (`autofit[postgres]`: psycopg 3) named, since
    SQLAlchemy's default for a bare postgresql:// differs between versions. Other URLs are unchanged."""
    import importlib.util

    scheme, _, rest = url.partition("://")
    if scheme not in ("postgresql", "postgres"):
        return url
    if importlib.util.find_spec("psycopg") is not None:
        return f"postgresql+psycopg://{rest}"
    if importlib.util.find_spec("psycopg2") is not None:
        return f"postgresql+psycopg2://{rest}"
    raise StorageError(f"The storage {url} needs a PostgreSQL driver, but none is installed: "
                       f"pip install 'autofit[postgres]'.")


@contextlib.contextmanager
def quiet_heartbeat_warnings():
    """autofit records heartbeats itself (Heartbeat below) while it asks and tells trials one by one:
    Optuna's warnings that heartbeats are experimental and meant for Study.optimize do not apply."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        yield


def storage_label(url: str | None) -> str:
    return url or default_storage_url()


def default_study_name(script: str, function: str | None, device: str, index: int) -> str:
    stem = os.path.splitext(os.path.basename(script))[0]
    return f"{stem}.{function or 'train'}-{device}{index}"
