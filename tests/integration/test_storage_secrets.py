"""A storage password is never printed or written: not by a search, not in the best-config file (made
to be committed), not by the commands that read a study, not in an error. It can stay off the command
line altogether through libpq's PGPASSWORD (or ~/.pgpass). Real PostgreSQL, with a role that must
authenticate by password."""

from __future__ import annotations

import json
import os

import pytest

from autofit.study import redacted, scrubbed
from tests.support import autofit_cli, script

SECRET = "pw-s3cret-7f2a"


def test_redacted_masks_only_the_password():
    assert redacted(f"postgresql://keeper:{SECRET}@db:5432/studies") == "postgresql://keeper:***@db:5432/studies"
    assert redacted("postgresql://keeper@db/studies") == "postgresql://keeper@db/studies"
    assert redacted("sqlite:///studies/autofit.db") == "sqlite:///studies/autofit.db"
    assert redacted("runs/shared.journal") == "runs/shared.journal"


@pytest.mark.parametrize(("url", "shown"), [
    (f"postgresql://keeper@db/studies?password={SECRET}", "postgresql://keeper@db/studies?password=***"),
    (f"postgresql://keeper@db/studies?sslmode=require&PASSWORD={SECRET}&application_name=autofit",
     "postgresql://keeper@db/studies?sslmode=require&PASSWORD=***&application_name=autofit"),
    (f"postgresql://keeper@db/studies?sslpassword={SECRET}&sslkey=/keys/k.pem",
     "postgresql://keeper@db/studies?sslpassword=***&sslkey=/keys/k.pem"),  # sslkey is a path, not a secret
    (f"mysql://keeper@db/studies?passwd={SECRET};pwd={SECRET}", "mysql://keeper@db/studies?passwd=***;pwd=***"),
    (f"postgresql://keeper@db/studies?token={SECRET}&secret={SECRET}&key={SECRET}&api_token={SECRET}",
     "postgresql://keeper@db/studies?token=***&secret=***&key=***&api_token=***"),
    (f"postgresql://keeper:{SECRET}@db/studies?password={SECRET}", "postgresql://keeper:***@db/studies?password=***"),
    (f"postgresql:/keeper:{SECRET}@db/studies", "postgresql:/keeper:***@db/studies"),  # a slash short
])
def test_redacted_masks_secrets_in_the_query_string_too(url, shown):
    assert redacted(url) == shown


def test_a_driver_error_that_echoes_the_url_is_scrubbed_of_its_secrets():
    url = f"postgresql://keeper@db/studies?password={SECRET.replace('-', '%2D')}"
    echoed = f"invalid connection string 'password={SECRET} host=db' in {url}"
    assert SECRET not in scrubbed(echoed, url) and "%2D" not in scrubbed(echoed, url)
    assert scrubbed(echoed, url).startswith("invalid connection string 'password=*** host=db'")


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


def _with_password(role_url: str, where: str) -> str:
    """The role's URL with its password in the credentials (`user:pw@`) or in the query string."""
    return role_url.replace("@", f":{SECRET}@", 1) if where == "credentials" else f"{role_url}?password={SECRET}"


def _files_holding(folder, secret: str) -> list[str]:
    """Every file under `folder` (best configs, reports, probe logs) whose bytes hold `secret`."""
    holding = []
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                if secret.encode() in handle.read():
                    holding.append(path)
    return holding


def _rows_holding(database_url: str, secret: str) -> list[str]:
    """Every row of every table of the study database (study and trial attributes among them) that
    holds `secret`, read as the server's superuser."""
    import psycopg

    with psycopg.connect(database_url) as connection:
        tables = [row[0] for row in connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")]
        return [f"{table}: {row[0]}" for table in tables
                for row in connection.execute(f'SELECT t::text FROM "{table}" t') if secret in row[0]]


@pytest.mark.postgres
@pytest.mark.parametrize("where", ["credentials", "query"])
def test_no_password_printed_or_written(tmp_path, postgres_url, password_role, where):
    """As `user:password@` or `?password=`: not in any output, file or row of the study's database."""
    with_password = _with_password(password_role, where)
    out = tmp_path / "best.json"
    searched = autofit_cli("search", script("fits_small.py"), "--device", "cpu", "--memory-limit", "1GiB",
                           "--storage", with_password, "--study", "secret", "--trials", "2", "--batch-size", "4:8",
                           "--budget", "2m", "--no-estimate", "--out", str(out), cwd=tmp_path)
    assert searched.returncode == 0, searched.stderr[-2000:]
    assert SECRET not in searched.stdout + searched.stderr
    assert json.loads(out.read_text())["study"]["storage"] == redacted(with_password)
    for command in (("studies",), ("show", "--study", "secret"),
                    ("export", "--study", "secret", "--out", str(tmp_path / "again.json")),
                    ("report", "--study", "secret", "--out", str(tmp_path / "report.html"))):
        shown = autofit_cli(*command, "--storage", with_password, cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr[-2000:]
        assert SECRET not in shown.stdout + shown.stderr
    assert (tmp_path / "again.json").exists() and (tmp_path / "report.html").exists()
    assert any((tmp_path / "studies" / "runs").rglob("*.log"))  # the probes' logs are among the files read
    assert _files_holding(tmp_path, SECRET) == []
    assert _rows_holding(postgres_url, SECRET) == []


@pytest.mark.postgres
@pytest.mark.parametrize("where", ["credentials", "query"])
def test_python_search_reads_its_trials_back(tmp_path, postgres_url, password_role, capfd, monkeypatch, where):
    """The result shows the storage masked, yet `trials_frame()` opens it with the real URL, kept in
    memory only (a masked URL would be refused by the server)."""
    import dataclasses

    from autofit.search import SearchSettings, run_search

    monkeypatch.chdir(tmp_path)
    with_password = _with_password(password_role, where)
    result = run_search(SearchSettings(script=script("fits_small.py"), memory_limit=2**30, storage=with_password,
                                       study="python", trials=2, budget_s=120, estimate=False,
                                       out=str(tmp_path / "best.json")))
    frame = result.trials_frame()
    assert len(frame) == result.probes >= 1
    assert result.storage == redacted(with_password)
    assert SECRET not in repr(result) + str(dataclasses.asdict(result))
    captured = capfd.readouterr()
    assert SECRET not in captured.out + captured.err
    assert _files_holding(tmp_path, SECRET) == []
    assert _rows_holding(postgres_url, SECRET) == []


@pytest.mark.postgres
def test_pgpassword_keeps_the_password_off_the_command_line(tmp_path, password_role):
    refused = autofit_cli("studies", "--storage", password_role, cwd=tmp_path, env={"PGPASSWORD": "wrong-" + SECRET})
    assert refused.returncode != 0
    assert len(refused.stderr.strip().splitlines()) == 1 and "must open" in refused.stderr
    assert SECRET not in refused.stdout + refused.stderr
    wrong = autofit_cli("studies", "--storage", f"{password_role}?password=wrong-{SECRET}", cwd=tmp_path)
    assert wrong.returncode != 0 and "must open" in wrong.stderr
    assert SECRET not in wrong.stdout + wrong.stderr
    listed = autofit_cli("studies", "--storage", password_role, cwd=tmp_path, env={"PGPASSWORD": SECRET})
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert f"storage {password_role}" in listed.stdout
