"""Shared set-up: whether tests marked ``postgres`` can run, decided once per session.

The server is named by ``TEST_POSTGRES_DSN`` (outside the ``FLOWVAULT_``
prefix on purpose: ``Settings.from_env()`` refuses any ``FLOWVAULT_*`` name it
does not know). When it cannot be reached the marked tests are skipped with
a one-line reason, except under ``CI=true``, where they fail: CI must never
pass by skipping them.

Every test also runs under the key-leak plugin (``key_leak_plugin``), which
fails the session if any key appears in output, logs or error messages.
"""

from __future__ import annotations

import functools
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from key_leak_plugin import (
    pytest_configure,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)
from log_capture import reset_flowvault_logging

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import SecureObjectStore

__all__ = [
    "pytest_configure",
    "pytest_runtest_logreport",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
]
"""The key-leak plugin's hooks, run for every test in the session."""

DSN_ENV = "TEST_POSTGRES_DSN"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


_DSN = os.environ.get(DSN_ENV) or DEFAULT_DSN


def postgres_dsn() -> str:
    """Return the DSN of the test server."""
    return _DSN


@functools.cache
def _unreachable() -> str | None:
    """Return why the test server cannot be used, or ``None`` when it answers."""
    try:
        import psycopg  # noqa: PLC0415 - only tests marked postgres need the extra
    except ImportError:
        return "psycopg is not installed (the postgres extra)"
    try:
        with psycopg.connect(postgres_dsn(), connect_timeout=5) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error as exc:
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip, or under CI fail, a ``postgres`` test when the server is unreachable."""
    if item.get_closest_marker("postgres") is None:
        return
    reason = _unreachable()
    if reason is None:
        return
    message = f"PostgreSQL at ${DSN_ENV} is unreachable: {reason}"
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


class PostgresServer:
    """The test server: its DSN, throwaway schemas, and an admin connection."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def new_schema(self) -> str:
        """Return a schema name no other test uses."""
        return f"fvtest_{secrets.token_hex(6)}"

    def admin(self):  # -> psycopg.Connection
        """Open an autocommit connection that is not one of a store's sessions."""
        import psycopg  # noqa: PLC0415

        return psycopg.connect(self.dsn, autocommit=True, application_name="flowvault-test-admin")

    def drop_schema(self, schema: str) -> None:
        """Remove a test schema and everything in it."""
        from psycopg import sql  # noqa: PLC0415

        with self.admin() as connection:
            statement = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            connection.execute(statement)


@pytest.fixture(scope="session")
def postgres_server() -> PostgresServer:
    """Provide the test server; request it only from tests marked ``postgres``."""
    return PostgresServer(postgres_dsn())


@pytest.fixture
def pg_schema(postgres_server: PostgresServer) -> Iterator[str]:
    """Provide a fresh schema name, dropped with its tables after the test."""
    schema = postgres_server.new_schema()
    try:
        yield schema
    finally:
        postgres_server.drop_schema(schema)


BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
"""Every adapter the scenario tests run on; PostgreSQL follows the skip-or-fail rule above."""


@pytest.fixture(params=BACKENDS)
def backend_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SecureObjectStore]:
    """Provide a fresh, empty store on each backend, closed after the test."""
    store: SecureObjectStore
    if request.param == "memory":
        store = InMemorySecureObjectStore()
    elif request.param == "sqlite":
        store = SQLiteSecureObjectStore.open(tmp_path / "data" / "store.db", create=True)
    else:
        from flowvault.adapters.postgres import PostgresSecureObjectStore  # noqa: PLC0415

        server = request.getfixturevalue("postgres_server")
        schema = request.getfixturevalue("pg_schema")
        store = PostgresSecureObjectStore.open(server.dsn, schema=schema, pool_size=2, create=True)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture(autouse=True)
def _private_data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the default home into the test's directory: a PostgreSQL host keeps its mark there."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    """Undo any logging set-up a test made (e.g. by calling the CLI's ``main`` in-process)."""
    yield
    reset_flowvault_logging()
