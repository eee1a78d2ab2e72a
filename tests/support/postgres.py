"""A real PostgreSQL server for the tests: Debian's server binaries, a cluster in a temporary folder,
listening on a free local port, stopped at the end. Never a mock: autofit's searchers share studies
through it exactly as they would across machines."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from autofit.probing import free_local_port


def _bin(name: str) -> str | None:
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))[-1:]
    return found if isinstance(found, str) else (found[0] if found else None)


@contextmanager
def postgres_server(folder: str) -> Iterator[str]:
    """A running server with a superuser `autofit` (trust auth, local only); yields its base URL."""
    pytest.importorskip("psycopg", reason="the postgres extra: pip install -e '.[postgres]'")
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("no PostgreSQL server binaries (Debian's postgresql package; .ci/run installs it)")
    as_postgres: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root: run it as Debian's postgres user
        shutil.chown(folder, "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    data, log, port = os.path.join(folder, "data"), os.path.join(folder, "server.log"), free_local_port()

    def run(*command: str) -> None:
        subprocess.run([*as_postgres, *command], check=True, capture_output=True, text=True, timeout=120)

    run(initdb, "-D", data, "-A", "trust", "-U", "autofit", "--no-sync")
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    run(pg_ctl, "-D", data, "-l", log, "-o", options, "-w", "start")
    try:
        yield f"postgresql://autofit@127.0.0.1:{port}"
    finally:
        subprocess.run([*as_postgres, pg_ctl, "-D", data, "-m", "immediate", "stop"], capture_output=True, timeout=60)


def create_database(base_url: str, name: str) -> str:
    """A fresh database on the server; its URL."""
    import psycopg

    with psycopg.connect(f"{base_url}/postgres", autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return f"{base_url}/{name}"
