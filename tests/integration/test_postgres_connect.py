"""A server that cannot be reached: one error line naming the cause, one fix line, no pool noise.

The CLI runs as a real subprocess against the real test server (an unknown
database or role), a port nothing listens on, and a socket that accepts
connections but never answers.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from flowvault.adapters.postgres import PostgresSecureObjectStore
from flowvault.adapters.postgres._errors import Target, unreachable
from flowvault.domain import StoreUnavailable
from tests.support.cli_helpers import json_document, run_cli

pytestmark = pytest.mark.postgres

PASSWORD = "pg-pass-93c1"


def _dsn(base: str, *, user: str = "", port: int = 0, db: str = "") -> str:
    """Return ``base`` with a password and any of its user, port or database replaced."""
    parts = urlsplit(base)
    host = parts.hostname or "127.0.0.1"
    login = f"{user or parts.username or 'postgres'}:{PASSWORD}"
    netloc = f"{login}@{host}:{port or parts.port or 5432}"
    return urlunsplit(parts._replace(netloc=netloc, path=f"/{db}" if db else parts.path))


def _free_port() -> int:
    """Return a local port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def silent_port() -> Iterator[int]:
    """Provide a port whose socket takes connections into its backlog and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


def _status(tmp_path: Path, dsn: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        tmp_path,
        "status",
        *args,
        FLOWVAULT_BACKEND="postgres",
        FLOWVAULT_POSTGRES_DSN=dsn,
        **extra,
    )


def _one_error(result: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    """Return the error and fix lines, after checking they are all the run printed."""
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("error: STORE_UNAVAILABLE: cannot connect to PostgreSQL at ")
    assert lines[1].startswith("  fix: ")
    assert PASSWORD not in result.stderr
    return lines[0], lines[1]


@pytest.mark.parametrize(
    ("change", "cause", "fix"),
    [
        ({"db": "fv_no_such_db"}, "database 'fv_no_such_db' does not exist", "create the database"),
        ({"user": "fv_no_such_role"}, "role 'fv_no_such_role' does not exist", "create the role"),
        ({"port": None}, "connection refused", "start the server"),
    ],
)
def test_an_unreachable_server_is_one_line_with_its_cause_and_fix(
    tmp_path: Path, postgres_server, change: dict, cause: str, fix: str
) -> None:
    """Unknown database, unknown role, refused port: the cause and its own fix, nothing else."""
    options = {**change, "port": _free_port()} if "port" in change else change
    error, fix_line = _one_error(_status(tmp_path, _dsn(postgres_server.dsn, **options)))
    assert f": {cause}" in error
    assert fix_line.startswith(f"  fix: {fix}")


def test_a_server_that_never_answers_times_out_naming_the_timeout(
    tmp_path: Path, silent_port: int
) -> None:
    """A socket that accepts and stays silent ends after the connect timeout, saying so."""
    dsn = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{silent_port}/test?sslmode=disable"
    error, fix_line = _one_error(_status(tmp_path, dsn, FLOWVAULT_POSTGRES_CONNECT_TIMEOUT="1"))
    assert error.endswith(f"127.0.0.1:{silent_port}: no answer within 2 s")
    assert "FLOWVAULT_POSTGRES_CONNECT_TIMEOUT" in fix_line


def test_the_json_error_carries_the_cause_specific_fix(tmp_path: Path, postgres_server) -> None:
    """With --json the document's fix is the cause's own, as on the text fix line."""
    result = _status(tmp_path, _dsn(postgres_server.dsn, db="fv_no_such_db"), "--json")
    assert result.returncode == 1
    error = json_document(result)["error"]
    assert isinstance(error, dict)
    assert error["code"] == "STORE_UNAVAILABLE"
    assert str(error["fix"]).startswith("create the database")
    assert result.stderr == ""


def test_open_names_the_cause_in_details(postgres_server, pg_schema: str) -> None:
    """The library raises the same error: cause and fix in details, no password anywhere."""
    dsn = _dsn(postgres_server.dsn, db="fv_no_such_db")
    with pytest.raises(StoreUnavailable) as caught:
        PostgresSecureObjectStore.open(dsn, schema=pg_schema, create=True)
    assert caught.value.details["cause"] == "unknown_database"
    assert str(caught.value.details["fix"]).startswith("create the database")
    assert PASSWORD not in str(caught.value) + repr(caught.value) + str(caught.value.details)


LIBPQ_TEXTS = [
    ('FATAL:  password authentication failed for user "u" hunter2', "authentication"),
    ('FATAL:  no pg_hba.conf entry for host "10.0.0.1", user "u"', "authentication"),
    ("FATAL:  sorry, too many clients already", "server_full"),
    ("FATAL:  the database system is starting up", "server_not_ready"),
    ("server does not support SSL, but SSL was required", "tls"),
    ('failed to resolve host "nowhere.invalid": Name or service not known', "unknown_host"),
    ('FATAL:  permission denied for database "d" hunter2', "other"),
    ("something nobody foresaw hunter2", "other"),
]


@pytest.mark.parametrize(("text", "cause"), LIBPQ_TEXTS)
def test_libpq_wording_picks_the_cause_and_is_never_quoted(text: str, cause: str) -> None:
    """Each known wording maps to its cause; the message names it without quoting libpq."""
    error = unreachable(psycopg.OperationalError(text), Target("h", "5432", "d", "u", 2))
    assert error.details["cause"] == cause
    assert error.code == "STORE_UNAVAILABLE"
    assert "hunter2" not in error.message
    assert error.message.startswith("cannot connect to PostgreSQL at h:5432: ")


POOL_WARNING = (
    "import logging, sys\n"
    "from flowvault.composition import configure_logging\n"
    "if sys.argv[1] == 'host': logging.basicConfig()\n"
    "configure_logging('info', 'json')\n"
    "logging.getLogger('psycopg.pool').warning('pool-attempt-failed')\n"
)


@pytest.mark.parametrize(("host_logging", "shown"), [("none", False), ("host", True)])
def test_pool_warnings_reach_only_a_handler_the_host_set_up(host_logging: str, shown: bool) -> None:
    """The CLI's logging set-up keeps pool warnings off stderr, not from the host's own handler."""
    result = subprocess.run(
        [sys.executable, "-P", "-c", POOL_WARNING, host_logging],
        capture_output=True,
        text=True,
        check=True,
    )
    assert ("pool-attempt-failed" in result.stderr) is shown


def test_waiting_for_a_pooled_connection_ends_at_the_connect_timeout(
    postgres_server, pg_schema: str
) -> None:
    """With the only connection held, another thread's call fails STORE_UNAVAILABLE, not hangs."""
    outcome: list[BaseException | None] = []
    with PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, pool_size=1, connect_timeout=0.2, create=True
    ) as store:
        with store.record_locked("ns", "digest"):

            def other() -> None:
                try:
                    store.has_records()
                    outcome.append(None)
                except BaseException as exc:  # handed to the main thread
                    outcome.append(exc)

            worker = threading.Thread(target=other)
            worker.start()
            worker.join(timeout=30)
        assert store.has_records() is False
    assert len(outcome) == 1
    assert isinstance(outcome[0], StoreUnavailable)
    assert "FLOWVAULT_POSTGRES_CONNECT_TIMEOUT" in outcome[0].message
