"""psycopg exceptions become flowvault errors by SQLSTATE or class, never by message text."""

from __future__ import annotations

import psycopg
import psycopg_pool
import pytest
from psycopg import errors, sql

from flowvault.adapters.postgres import PostgresSecureObjectStore
from flowvault.adapters.postgres._errors import Timeouts, translate
from flowvault.adapters.postgres._store import ATTEMPTS
from flowvault.application import UnitOfWork
from flowvault.application.testing import make_event, make_header, make_upsert
from flowvault.domain import (
    IntegrityFailure,
    InvalidInput,
    RevisionConflict,
    StoreBusy,
    StoreUnavailable,
)

pytestmark = pytest.mark.postgres

MARKER = "row-value-7f3a password=hunter2"
TIMEOUTS = Timeouts(statement_ms=1500, lock_ms=250)

SERVER_ERRORS = [
    ("57014", StoreBusy),  # statement_timeout
    ("55P03", StoreBusy),  # lock_timeout
    ("40001", RevisionConflict),
    ("40P01", RevisionConflict),
    ("23505", RevisionConflict),
    ("XX001", IntegrityFailure),
    ("XX002", IntegrityFailure),
    ("22003", InvalidInput),
    ("22021", InvalidInput),
    ("22P05", InvalidInput),
    ("08000", StoreUnavailable),
    ("08001", StoreUnavailable),
    ("08006", StoreUnavailable),
    ("57P01", StoreUnavailable),  # admin_shutdown: pg_terminate_backend
    ("57P02", StoreUnavailable),
    ("57P03", StoreUnavailable),
    ("53100", StoreUnavailable),
    ("53300", StoreUnavailable),
    ("25006", StoreUnavailable),  # read-only transaction: connected to a standby
    ("25P03", StoreUnavailable),
    ("28P01", StoreUnavailable),
    ("3D000", StoreUnavailable),
    ("42501", StoreUnavailable),
    ("42P01", StoreUnavailable),
    ("23514", StoreUnavailable),
]

CLIENT_ERRORS = [
    (psycopg.OperationalError, StoreUnavailable),  # connection lost, no SQLSTATE
    (psycopg.InterfaceError, StoreUnavailable),
    (errors.ConnectionTimeout, StoreUnavailable),
    (psycopg_pool.PoolTimeout, StoreUnavailable),
    (psycopg_pool.PoolClosed, StoreUnavailable),
    (psycopg.DataError, InvalidInput),  # e.g. NUL in text, refused before sending
    (psycopg.DatabaseError, StoreUnavailable),
    (psycopg.Error, StoreUnavailable),
]


@pytest.mark.parametrize(("sqlstate", "expected"), SERVER_ERRORS)
def test_sqlstates_map_to_flowvault_errors(sqlstate: str, expected: type) -> None:
    """The SQLSTATE decides the error class; the driver's text never shows."""
    kind = errors.lookup(sqlstate)
    assert kind.sqlstate == sqlstate
    translated = translate(kind(f"deadlock detected near {MARKER!r}"), TIMEOUTS)
    assert type(translated) is expected
    assert translated.details["sqlstate"] == sqlstate
    assert sqlstate in str(translated)
    assert MARKER not in str(translated) + repr(translated)


@pytest.mark.parametrize(("kind", "expected"), CLIENT_ERRORS)
def test_errors_without_a_sqlstate_map_by_class(kind: type, expected: type) -> None:
    """Errors raised before the server answered are mapped by their class."""
    translated = translate(kind(f"canceling statement due to lock timeout {MARKER}"), TIMEOUTS)
    assert type(translated) is expected
    assert MARKER not in str(translated) + repr(translated)


def test_message_text_never_decides() -> None:
    """A timeout's wording on an unrelated SQLSTATE is still STORE_UNAVAILABLE."""
    lying = errors.UndefinedTable("canceling statement due to statement timeout")
    assert type(translate(lying, TIMEOUTS)) is StoreUnavailable


def test_busy_errors_name_the_timeouts() -> None:
    """STORE_BUSY says which limits ran out, so an operator knows what to raise."""
    busy = translate(errors.LockNotAvailable(), TIMEOUTS)
    assert busy.details == {
        "sqlstate": "55P03",
        "statement_timeout_ms": 1500,
        "lock_timeout_ms": 250,
    }


# -- against the server ---------------------------------------------------------


@pytest.fixture
def store(postgres_server, pg_schema: str):
    """Provide a store with short timeouts."""
    opened = PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, lock_timeout=0.2, statement_timeout=5, create=True
    )
    with opened:
        yield opened


def _lock_table(postgres_server, schema: str, table: str):
    admin = postgres_server.admin()
    admin.execute("BEGIN")
    admin.execute(
        sql.SQL("LOCK TABLE {}.{} IN ACCESS EXCLUSIVE MODE").format(
            sql.Identifier(schema), sql.Identifier(table)
        )
    )
    return admin


def test_lock_timeout_is_store_busy_and_writes_nothing(store, postgres_server) -> None:
    """A unit that waits past lock_timeout fails with STORE_BUSY and leaves no trace."""
    admin = _lock_table(postgres_server, store.schema, "ledger_streams")
    try:
        with pytest.raises(StoreBusy) as caught:
            store.commit(UnitOfWork(upserts=[make_upsert("ns", "a")], appends=[make_event("s", 0)]))
    finally:
        admin.close()
    assert caught.value.details["sqlstate"] == "55P03"
    assert store.load("ns", make_header("ns", "a").key_digest) is None
    store.commit(UnitOfWork(upserts=[make_upsert("ns", "a")], appends=[make_event("s", 0)]))


def test_statement_timeout_is_store_busy(postgres_server, pg_schema: str) -> None:
    """A statement that runs past statement_timeout fails with STORE_BUSY."""
    with PostgresSecureObjectStore.open(
        postgres_server.dsn, schema=pg_schema, lock_timeout=30, statement_timeout=0.2, create=True
    ) as store:
        admin = _lock_table(postgres_server, pg_schema, "records")
        try:
            with pytest.raises(StoreBusy) as caught:
                store.has_records()
        finally:
            admin.close()
        assert caught.value.details["sqlstate"] == "57014"
        assert store.has_records() is False


@pytest.mark.parametrize("text", ["nul\x00inside", "lone\ud800surrogate"])
def test_text_postgres_cannot_hold_is_invalid_input(store, text: str) -> None:
    """NUL characters and lone surrogates in a port argument are INVALID_INPUT."""
    with pytest.raises(InvalidInput):
        store.ledger_head(text)
    with pytest.raises(InvalidInput):
        store.load(text, make_header("ns", "a").key_digest)


def test_serialization_failures_rerun_the_whole_transaction(store) -> None:
    """40001 and 40P01 re-run the transaction; after ATTEMPTS tries they are REVISION_CONFLICT."""
    calls: list[int] = []

    def flaky(connection) -> str:
        calls.append(1)
        connection.execute("SELECT 1")
        if len(calls) < 3:
            raise errors.SerializationFailure()
        return "done"

    assert store._run(flaky, transaction=True) == "done"
    assert len(calls) == 3
    calls.clear()

    def deadlocked(connection) -> None:
        calls.append(1)
        raise errors.DeadlockDetected()

    with pytest.raises(RevisionConflict) as caught:
        store._run(deadlocked, transaction=True)
    assert len(calls) == ATTEMPTS
    assert caught.value.details == {"guard": "transaction", "sqlstate": "40P01"}


def test_other_errors_are_not_rerun(store) -> None:
    """Only serialization failures and deadlocks are retried."""
    calls: list[int] = []

    def broken(connection) -> None:
        calls.append(1)
        raise errors.UndefinedTable()

    with pytest.raises(StoreUnavailable):
        store._run(broken, transaction=True)
    assert len(calls) == 1
