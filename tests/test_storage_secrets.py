"""A storage password is never printed or written: not by a search, not in the best-config file (made
to be committed), not by the commands that read a study, not in an error. It can stay off the command
line altogether through libpq's PGPASSWORD (or ~/.pgpass). Real PostgreSQL, with a role that must
authenticate by password."""

from __future__ import annotations

import json

import pytest

from autofit.study import redacted
from tests.conftest import autofit_cli, script

SECRET = "pw-s3cret-7f2a"


def test_redacted_masks_only_the_password():
    assert redacted(f"postgresql://keeper:{SECRET}@db:5432/studies") == "postgresql://keeper:***@db:5432/studies"
    assert redacted("postgresql://keeper@db/studies") == "postgresql://keeper@db/studies"
    assert redacted("sqlite:///studies/autofit.db") == "sqlite:///studies/autofit.db"
    assert redacted("runs/shared.journal") == "runs/shared.journal"


@pytest.fixture
def password_role(postgres_url):
    """A role of the test's own that the server lets in only with its password (scram), owning the
    test's database; its URL without the password."""
    import psycopg

    base, database = postgres_url.rsplit("/", 1)
    role = "k_" + database[-40:]  # roles are per server: one per test
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{SECRET}'")
        connection.execute(f'ALTER DATABASE "{database}" OWNER TO {role}')
        hba_file = connection.execute("SHOW hba_file").fetchone()[0]
        with open(hba_file) as handle:
            rules = handle.read()
        with open(hba_file, "w") as handle:  # first match wins: keeper must give its password
            handle.write(f"host all {role} 127.0.0.1/32 scram-sha-256\n" + rules)
        connection.execute("SELECT pg_reload_conf()")
    host = base.split("@", 1)[1]
    return f"postgresql://{role}@{host}/{database}"


@pytest.mark.postgres
def test_a_password_in_the_url_is_never_printed_or_written(tmp_path, password_role):
    with_password = password_role.replace("@", f":{SECRET}@", 1)
    out = tmp_path / "best.json"
    searched = autofit_cli("search", script("fits_small.py"), "--device", "cpu", "--memory-limit", "1GiB",
                           "--storage", with_password, "--study", "secret", "--trials", "2", "--batch-size", "4:8",
                           "--budget", "2m", "--no-estimate", "--out", str(out), cwd=tmp_path)
    assert searched.returncode == 0, searched.stderr[-2000:]
    assert SECRET not in searched.stdout + searched.stderr
    document = out.read_text()
    assert SECRET not in document
    assert json.loads(document)["study"]["storage"] == redacted(with_password)
    for command in (("studies",), ("show", "--study", "secret"), ("export", "--study", "secret", "--out",
                                                                   str(tmp_path / "again.json"))):
        shown = autofit_cli(*command, "--storage", with_password, cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr[-2000:]
        assert SECRET not in shown.stdout + shown.stderr
    assert SECRET not in (tmp_path / "again.json").read_text()


@pytest.mark.postgres
def test_pgpassword_keeps_the_password_off_the_command_line(tmp_path, password_role):
    refused = autofit_cli("studies", "--storage", password_role, cwd=tmp_path, env={"PGPASSWORD": "wrong-" + SECRET})
    assert refused.returncode != 0
    assert len(refused.stderr.strip().splitlines()) == 1 and "must open" in refused.stderr
    assert SECRET not in refused.stdout + refused.stderr
    listed = autofit_cli("studies", "--storage", password_role, cwd=tmp_path, env={"PGPASSWORD": SECRET})
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert f"storage {password_role}" in listed.stdout
