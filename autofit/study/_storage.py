"""Optuna storages, the one place that reads a storage URL: open one for a search (created if new,
with heartbeats where the backend has them) or for reading (it must exist), the file behind a URL, the
driver a PostgreSQL URL needs, and the URL as it may be shown (`redacted`: never a password)."""

from __future__ import annotations

import contextlib
import os
import re
import time
import warnings
from urllib.parse import unquote, unquote_plus

import optuna

from autofit.errors import StorageError
from autofit.redaction import is_secret_name

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
    shown = redacted(url)
    path = storage_file(url)
    if path is not None and not is_journal(url):
        directory = os.path.dirname(os.path.abspath(path)) or "."
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"The storage {shown} must be writable, but its folder cannot be made: {exc.strerror}.") from None
        if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
            raise StorageError(f"The storage {shown} must be writable, but {path} is not.")
    driver_url = engine_url(url)
    for attempt in range(3):
        try:
            if is_journal(url):
                return _journal(url)
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
            raise StorageError(f"The storage {shown} must open, but it failed: {_first_line(exc, url)}") from None
    raise AssertionError("unreachable")


def open_for_reading(url: str) -> optuna.storages.BaseStorage:
    """An existing storage; StorageError when it is missing, rather than creating an empty one."""
    path = storage_file(url)
    if path is not None and not os.path.exists(path):
        raise StorageError(f"The storage {redacted(url)} must exist, but {path} does not.")
    try:
        return _journal(url) if is_journal(url) else optuna.storages.RDBStorage(engine_url(url))
    except Exception as exc:  # noqa: BLE001 - any driver error means the same thing to the user
        raise StorageError(f"The storage {redacted(url)} must open, but it failed: {_first_line(exc, url)}") from None


def storage_exists(url: str) -> bool:
    """False only for a storage file that is missing (a database server is assumed to be there)."""
    path = storage_file(url)
    return path is None or os.path.exists(path)


def is_journal(url: str) -> bool:
    """A JournalStorage file (several processes on one machine, no database): named by its path."""
    return url.endswith(".journal") or url.endswith(".log")


def storage_file(url: str) -> str | None:
    """The file behind a file-based storage URL (None for a database server)."""
    if url.startswith("sqlite:///"):
        return url[len("sqlite:///"):]
    return url if is_journal(url) else None


_PARAMETER = re.compile(r"(?P<name>[^&;=#]+)=(?P<value>[^&;#]*)")
_SCHEME = re.compile(r"^[A-Za-z][\w+.-]*:/+")
#: After the scheme: `user:password@host...`, the password up to the last "@" before the query.
_CREDENTIALS = re.compile(r"^(?P<user>[^:@/]*):(?P<password>.*)@(?P<host>[^@]*)$")


def _credentials(base: str) -> tuple[str, re.Match | None]:
    """The scheme of a URL without its query, and its `user:password@host` part where it has one."""
    scheme = _SCHEME.match(base)
    prefix = scheme[0] if scheme else ""
    return prefix, _CREDENTIALS.match(base[len(prefix):])


def secrets_in(url: str) -> list[str]:
    """The secrets a storage URL carries: the password of `user:password@`, and the value of each
    secret query-string parameter; each as written and percent-decoded, longest first."""
    base, _, query = url.partition("?")
    found = []
    _, credentials = _credentials(base)
    if credentials and credentials["password"]:
        found.append(credentials["password"])
    found += [m["value"] for m in _PARAMETER.finditer(query) if m["value"] and is_secret_name(unquote_plus(m["name"]))]
    forms = {form for secret in found for form in (secret, unquote(secret), unquote_plus(secret)) if form}
    return sorted(forms, key=len, reverse=True)


def redacted(url: str | None) -> str:
    """The URL as it may be printed or written to a file: every secret becomes `***`, the password of
    `user:password@` and secret query-string parameters alike (`postgresql://autofit:***@db:5432/studies`,
    `postgresql://autofit@db/studies?password=***`). Pass the password through libpq's PGPASSWORD or
    ~/.pgpass instead, and it never appears at all."""
    url = url or default_storage_url()
    base, question, query = url.partition("?")
    scheme, credentials = _credentials(base)
    if credentials and credentials["password"]:
        base = f"{scheme}{credentials['user']}:***@{credentials['host']}"
    query = _PARAMETER.sub(lambda m: f"{m['name']}=***" if is_secret_name(unquote_plus(m["name"])) else m[0], query)
    return base + question + query


def scrubbed(text: str, url: str) -> str:
    """`text` (a driver's error, which may echo the URL or its parts) with `url`'s secrets masked."""
    for secret in secrets_in(url):
        text = text.replace(secret, "***")
    return text


def _journal(url: str) -> optuna.storages.BaseStorage:
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(url))


def _first_line(exc: BaseException, url: str) -> str:
    """A driver error's first line, with the URL's secrets (which drivers may echo) masked."""
    text = scrubbed(str(exc), url).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


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
    raise StorageError(f"The storage {redacted(url)} needs a PostgreSQL driver, but none is installed: "
                       f"pip install 'torch-autofit[postgres]'.")


@contextlib.contextmanager
def quiet_heartbeat_warnings():
    """autofit records heartbeats itself (Heartbeat below) while it asks and tells trials one by one:
    Optuna's warnings that heartbeats are experimental and meant for Study.optimize do not apply."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        yield


def storage_label(url: str | None) -> str:
    """The storage a search uses, as it may be shown (see `redacted`)."""
    return redacted(url)


def default_study_name(script: str, function: str | None, device: str, index: int) -> str:
    """`<script stem>.<function>-<device><index>`: named after the function searched (`main` gives
    `train_hf.main-cpu0`); `train` when the script has one decorated function and none was named."""
    stem = os.path.splitext(os.path.basename(script))[0]
    return f"{stem}.{function or 'train'}-{device}{index}"
